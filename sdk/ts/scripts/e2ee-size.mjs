// Prints what the E2E code adds to a page: sdk/ts/dist/e2ee bundled with
// its packages (@noble/*) by esbuild for the browser, minified, and its
// gzip size (level 9), the page's committed bundle, and the page's own
// files (web/static, each gzipped). Run after `npm run build`: node scripts/e2ee-size.mjs
import { build } from "esbuild";
import { readdirSync, readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import { gzipSync } from "node:zlib";

const r = await build({
  entryPoints: ["dist/e2ee/index.js"],
  bundle: true,
  minify: true,
  format: "esm",
  platform: "browser",
  write: false,
});
const js = r.outputFiles[0].contents;
const gz = (b) => gzipSync(b, { level: 9 }).length;
let page = 0;
let pageGz = 0;
const walk = (d) => {
  for (const f of readdirSync(d)) {
    const p = join(d, f);
    if (statSync(p).isDirectory()) walk(p);
    else {
      const b = readFileSync(p);
      page += b.length;
      pageGz += gz(b);
    }
  }
};
walk("../../web/static");
const kb = (n) => (n / 1024).toFixed(1) + " KiB";
console.log(`e2ee bundle: ${kb(js.length)} minified, ${kb(gz(js))} gzipped`);
const page1 = readFileSync("../../web/static/js/e2ee.js");
console.log(`the page's bundle (web/static/js/e2ee.js: the above, IDBStore, the QR encoder): ${kb(page1.length)}, ${kb(gz(page1))} gzipped`);
console.log(`page (web/static): ${kb(page)}, ${kb(pageGz)} gzipped file by file`);
