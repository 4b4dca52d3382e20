// The page's E2E module: everything of ./index.js plus the IndexedDB
// store, bundled with its packages (@noble/*) into web/static/js/e2ee.js
// by scripts/bundle-e2ee.mjs.

export * from "./index.js";
export * from "./idbstore.js";
// The safety number's QR code (the page shows it as SVG).
export { encodeQR } from "qr";
