import { test } from "node:test";
import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import { Sha256 } from "../dist/index.js";

const ref = (b) => createHash("sha256").update(b).digest("hex");

test("sha256: FIPS 180-4 vectors", () => {
  assert.equal(new Sha256().hex(), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  assert.equal(new Sha256().update(new TextEncoder().encode("abc")).hex(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  assert.equal(new Sha256().update(new TextEncoder().encode("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")).hex(),
    "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
});

test("sha256: every length around the block and padding edges, in one piece and in random chunks", () => {
  for (let n = 0; n <= 300; n++) {
    const b = randomBytes(n);
    assert.equal(new Sha256().update(b).hex(), ref(b), `length ${n}`);
    const h = new Sha256();
    for (let off = 0; off < n;) {
      const k = Math.min(n - off, 1 + Math.floor(Math.random() * 70));
      h.update(b.subarray(off, off + k));
      off += k;
    }
    assert.equal(h.hex(), ref(b), `length ${n} in chunks`);
  }
});

test("sha256: 16 MiB in 1 MiB chunks matches node:crypto (and how fast it is)", () => {
  const b = randomBytes(16 << 20);
  const t0 = performance.now();
  const h = new Sha256();
  for (let off = 0; off < b.length; off += 1 << 20) h.update(b.subarray(off, off + (1 << 20)));
  const got = h.hex();
  const ms = performance.now() - t0;
  assert.equal(got, ref(b));
  console.log(`sha256: ${(16 / (ms / 1000)).toFixed(0)} MiB/s`);
});

test("sha256: update after digest throws", () => {
  const h = new Sha256();
  h.digest();
  assert.throws(() => h.update(new Uint8Array(1)));
});
