// Bundles the page's E2E module (dist/e2ee/browser.js with @noble/*) into
// one minified ES module, web/static/js/e2ee.js, which the page imports
// when it starts. Run by `npm run build` after tsc.
import { build } from "esbuild";

await build({
  entryPoints: ["dist/e2ee/browser.js"],
  bundle: true,
  minify: true,
  format: "esm",
  platform: "browser",
  target: "es2022",
  legalComments: "eof",
  outfile: "../../web/static/js/e2ee.js",
  logLevel: "warning",
});
