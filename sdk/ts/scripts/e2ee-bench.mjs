// Timings of the TypeScript E2E code in Node, the cases of client/e2ee's
// bench_test.go: session setup (a new device, a bundle without one-time
// keys, the first PreKey message opened), encrypt and decrypt of a
// 100-byte message through Device (state loaded and saved per message in
// a MemoryStore), group encrypt and decrypt. Run after `npm run build`:
//   node scripts/e2ee-bench.mjs [messages] [setups]
import * as e from "../dist/e2ee/index.js";

const N = Number(process.argv[2] ?? 2000);
const S = Number(process.argv[3] ?? 100);
const msg = new Uint8Array(100);

async function time(n, f) {
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < n; i++) await f(i);
  return Number(process.hrtime.bigint() - t0) / n / 1000; // µs
}

const bob = await e.Device.open(new e.MemoryStore(), { user: "bob", device: "b" });
const up = await bob.generateKeys(1);
const reusable = {
  user: "bob",
  device: "b",
  registrationId: up.registrationId,
  identityKey: up.identityKey,
  signedPreKey: up.signedPreKey,
  kemPreKey: up.lastResortKEM,
};
const setup = await time(S, async (i) => {
  const a = await e.Device.open(new e.MemoryStore(), { user: "alice", device: "a" + i });
  await a.processBundle(reusable);
  const c = await a.encrypt({ user: "bob", device: "b" }, e.utf8("hello"));
  await bob.decrypt({ user: "alice", device: "a" + i }, c.type, c.body);
});

const A = { user: "alice", device: "pair" };
const B = { user: "bob", device: "b" };
const alice = await e.Device.open(new e.MemoryStore(), A);
await alice.processBundle(reusable);
let c = await alice.encrypt(B, msg);
await bob.decrypt(A, c.type, c.body);
c = await bob.encrypt(A, msg);
await alice.decrypt(B, c.type, c.body);

// The receiver opens the messages just timed, in order (no skipped keys).
const cts = [];
const enc = await time(N, async () => cts.push(await alice.encrypt(B, msg)));
const dec = await time(N, (i) => bob.decrypt(A, cts[i].type, cts[i].body));

await bob.processGroupDistribution("g", A, await alice.groupDistribution("g"));
const gcts = [];
const genc = await time(N, async () => gcts.push(await alice.groupEncrypt("g", msg)));
const gdec = await time(N, (i) => bob.groupDecrypt("g", A, gcts[i]));

console.log(`node ${process.version}, ${N} messages, ${S} setups`);
console.log(`session setup, PQXDH: ${(setup / 1000).toFixed(2)} ms`);
console.log(`encrypt, 100 bytes, through Device: ${enc.toFixed(0)} µs`);
console.log(`decrypt, same: ${dec.toFixed(0)} µs`);
console.log(`group encrypt: ${genc.toFixed(0)} µs`);
console.log(`group decrypt: ${gdec.toFixed(0)} µs`);
