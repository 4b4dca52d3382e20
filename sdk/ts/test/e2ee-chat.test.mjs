// E2EChat against a real `parley serve`: TypeScript devices publish keys,
// chat in an encrypted direct conversation and group, a user's second
// device reads too, a removed member cannot read what follows, a device
// reopened from its FileStore goes on, and the server's data never holds
// the plaintext. (Go ↔ TypeScript over a server: client/e2eechat's
// TestTypeScriptChat.)
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, readdirSync, readFileSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Server } from "./server.mjs";
import * as e from "../dist/e2ee/index.js";
import { FileStore } from "../dist/e2ee/filestore.js";

let srv;
before(async () => { srv = await Server.start(); });
after(async () => { await srv?.close(); });

async function member(user, device, store = new e.MemoryStore()) {
  const c = await srv.client(user, device);
  await c.log.waitConnected();
  const d = await e.Device.open(store, { user, device });
  const chat = new e.E2EChat(c, d);
  return { c, d, chat, user, device };
}

// opened waits for n shown (non-control) messages of conv opened by m.
async function opened(m, conv, n) {
  await m.c.log.waitFor(() => true);
  const out = [];
  const seen = new Set();
  const deadline = Date.now() + 15000;
  while (Date.now() < deadline) {
    for (const msg of m.c.log.messages(conv)) {
      if (seen.has(msg.seq)) continue;
      seen.add(msg.seq);
      const o = await m.chat.open(msg);
      if (!o.control && !o.system) out.push(o);
    }
    if (out.length >= n) return out;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`${m.user}/${m.device}: ${out.length} of ${n} messages in ${conv}`);
}

function walk(dir, f) {
  for (const n of readdirSync(dir)) {
    const p = join(dir, n);
    if (statSync(p).isDirectory()) walk(p, f);
    else f(p);
  }
}

test("direct: both ways, a second device of each user, edits, search, safety numbers, no plaintext on the server", async () => {
  const a1 = await member("ea", "web");
  const a2 = await member("ea", "laptop");
  const b1 = await member("eb", "web");
  await a1.chat.publishKeys(5);
  await a2.d.importAccountKey(await a1.d.exportAccountKey());
  await a2.chat.publishKeys(5);
  await b1.chat.publishKeys(5);
  const conv = await a1.c.openDirect("eb", { e2e: true });
  assert.equal(conv.e2e, true);
  const canary = "canary-" + e.toHex(e.randomBytes(8));
  await a1.chat.send(conv.conv_id, "hello " + canary);
  const ack = await b1.chat.sendDirect(conv.conv_id, "ea", "hi back");
  const seen = new Map();
  for (const m of [a1, a2, b1]) {
    seen.set(m, await opened(m, conv.conv_id, 2));
    assert.deepEqual(seen.get(m).map((o) => o.text), ["hello " + canary, "hi back"], `${m.user}/${m.device}`);
  }
  await a1.chat.editDirect(conv.conv_id, ack.seq - 1, "eb", "hello (edited)");
  for (const m of [a1, a2, b1]) {
    const got = await opened(m, conv.conv_id, 3);
    assert.equal(got.at(-1).kind, "edit", `${m.user}/${m.device}`);
    assert.equal(got.at(-1).text, "hello (edited)");
    // The target's record follows the edit: reopened, it shows the new text.
    const target = m.c.log.messages(conv.conv_id).find((x) => x.seq === ack.seq - 1);
    assert.equal((await m.chat.open(target)).text, "hello (edited)");
  }
  // The raw bodies are envelopes, never the text.
  for (const msg of b1.c.log.messages(conv.conv_id)) assert.ok(!msg.body.includes(canary) && msg.body.startsWith('{"e2e":1'));
  assert.deepEqual((await b1.chat.search("EDITED")).map((h) => h.text), ["hello (edited)", "hello (edited)"]);
  const n1 = await a1.chat.safetyNumber("eb");
  assert.equal(n1, await b1.chat.safetyNumber("ea"));
  assert.match(n1, /^\d{60}$/);
  let found = false;
  walk(srv.dataDir, (p) => { if (readFileSync(p).includes(canary)) found = true; });
  assert.ok(!found, "the plaintext reached the server's data directory");
  // A message whose labels the server changed is refused.
  const msgs = b1.c.log.messages(conv.conv_id);
  const forged = { ...msgs[0], seq: 99 };
  await assert.rejects(b1.chat.open(forged), (err) => err.code === "metadata_mismatch" || err.code === "duplicate");
});

test("group: sender keys, a member removed cannot read what follows, a FileStore device reopened goes on", async () => {
  const dir = mkdtempSync(join(tmpdir(), "parley-e2ee-chat-"));
  const g1 = await member("ga", "web", await FileStore.open(dir));
  const g2 = await member("gb", "web");
  const g3 = await member("gc", "web");
  for (const m of [g1, g2, g3]) await m.chat.publishKeys(5);
  const conv = await g1.c.createGroup("secret", ["gb", "gc"], { e2e: true });
  await g1.chat.send(conv.conv_id, "to all three");
  await g2.chat.send(conv.conv_id, "from b");
  for (const m of [g1, g2, g3]) assert.deepEqual((await opened(m, conv.conv_id, 2)).map((o) => o.text), ["to all three", "from b"]);
  // gc is removed: the others rotate their sender keys when they open the event.
  await g1.c.removeMembers(conv.conv_id, ["gc"]);
  await g1.c.log.waitFor((ev) => ev.some((x) => x.kind === "message" && x.message.kind === "system"), "member_removed");
  await g2.c.log.waitFor((ev) => ev.some((x) => x.kind === "message" && x.message.kind === "system"), "member_removed");
  // Opening the event (opened opens every message) rotates the keys.
  await opened(g1, conv.conv_id, 2);
  await opened(g2, conv.conv_id, 2);
  // g1's device is reopened from its files (a reload): sessions and keys survive.
  await g1.d.store.close();
  const g1b = { ...g1, d: await e.Device.open(await FileStore.open(dir), { user: "ga", device: "web" }) };
  g1b.chat = new e.E2EChat(g1.c, g1b.d);
  assert.ok(e.equal(g1b.d.identityKey, g1.d.identityKey));
  await g1b.chat.sendGroup(conv.conv_id, ["gb"], "after removal");
  const b = await opened(g2, conv.conv_id, 3);
  assert.equal(b.at(-1).text, "after removal");
  // gc still gets what the server pushes it? It is no member: no push; and
  // the ciphertext is under a key gc never received.
  const last = g2.c.log.messages(conv.conv_id).at(-1);
  await assert.rejects(g3.chat.open(last), (err) => err.code === "no_sender_key" || err.code === "not_for_device");
  await g1b.d.store.close();
});

test("maintain: the signed prekey and last-resort KEM key rotate on schedule; first messages on the old ones open within the grace period", async () => {
  const r1 = await member("ra", "web");
  const r2 = await member("rb", "web");
  await r1.chat.publishKeys(0); // no one-time keys: bundles hand out the signed and last-resort keys
  await r2.chat.publishKeys(0);
  let now = Date.now();
  r1.d.now = () => now;
  const before = await r1.d.publicKeys();
  await r1.chat.maintain(); // nothing due yet
  assert.equal((await r1.d.publicKeys()).signedPreKey.id, before.signedPreKey.id);
  const conv = await r2.c.openDirect("ra", { e2e: true });
  // A session started on the old keys, its first message sent after the rotation.
  await r2.chat.devices("ra", true);
  const stale = await r2.chat.sendDirect(conv.conv_id, "ra", "on the old keys");
  now += e.DEFAULT_ROTATION.everyMs + 1000;
  await r1.chat.maintain();
  const after = await r1.d.publicKeys();
  assert.notEqual(after.signedPreKey.id, before.signedPreKey.id);
  assert.notEqual(after.lastResortKEM.id, before.lastResortKEM.id);
  const got = await opened(r1, conv.conv_id, 1);
  assert.equal(got.find((o) => o.seq === stale.seq).text, "on the old keys");
  // A new device of rb gets the new keys from the server.
  const r3 = await member("rb", "tablet");
  await r3.d.importAccountKey(await r2.d.exportAccountKey());
  await r3.chat.publishKeys(0);
  await r3.chat.sendDirect(conv.conv_id, "ra", "on the new keys");
  assert.ok((await opened(r1, conv.conv_id, 2)).some((o) => o.text === "on the new keys"));
  // After the grace period the old keys are gone.
  now += e.DEFAULT_ROTATION.graceMs + 1000;
  await r1.chat.maintain();
  assert.equal(await r1.d.store.load("signed/" + before.signedPreKey.id), null);
  assert.equal(await r1.d.store.load("kem/" + before.lastResortKEM.id), null);
});
