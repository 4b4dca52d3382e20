// Key transparency checks of E2EChat against a real `parley serve` (its
// log on by default): honest answers verify — the checkpoint's signature,
// the user's VRF label, the entry's inclusion, the devices as logged, a
// newer checkpoint's consistency with the last one — and a server that
// changes any of these is refused with a KTError (a client in between
// rewrites the server's answers, as a malicious server would send them).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { Server } from "./server.mjs";
import * as e from "../dist/e2ee/index.js";

let srv;
before(async () => { srv = await Server.start(); });
after(async () => { await srv?.close(); });

async function member(user, device) {
  const c = await srv.client(user, device);
  await c.log.waitConnected();
  const d = await e.Device.open(new e.MemoryStore(), { user, device });
  return { c, d, chat: new e.E2EChat(c, d) };
}

// A client whose answers of type `type` pass through tamper first.
function tampering(c, type, tamper) {
  return {
    async request(f, ...rest) {
      const r = await c.request(f, ...rest);
      return f.type === type ? tamper(structuredClone(r)) : r;
    },
  };
}

const flip = (b64, i = 0) => {
  const b = e.fromBase64(b64);
  b[i] ^= 1;
  return e.toBase64(b);
};

test("honest answers verify; every forgery is refused", async () => {
  const bob = await member("ktb", "phone");
  await bob.chat.publishKeys(2);
  const carol = await member("ktc", "phone");
  await carol.chat.publishKeys(2);
  const alice = await member("kta", "web");
  await alice.chat.publishKeys(2);
  // Key answers are for users one shares a conversation with.
  const conv = (await alice.c.openDirect("ktb", { e2e: true })).conv_id;
  await alice.c.openDirect("ktc", { e2e: true });

  // Honest: the list and a bundle, proven.
  assert.deepEqual(await alice.chat.devices("ktb"), ["phone"]);
  const kt = (await alice.c.request({ type: "keys_devices", user_id: "ktb" })).kt;
  assert.ok(kt.checkpoint && kt.entry && kt.vrf_proof, "the server sends proofs");

  const refused = async (name, type, tamper, code = "kt_proof") => {
    const d = await e.Device.open(new e.MemoryStore(), { user: "kta", device: "w-" + name.replace(/\W/g, "") });
    const chat = new e.E2EChat(tampering(alice.c, type, tamper), d);
    const events = [];
    chat.onKT = (ev) => events.push(ev);
    await assert.rejects(chat.devices("ktb", true), (err) => err instanceof e.KTError && err.code === code, name);
    assert.equal(events.length, 1, name + ": reported");
    assert.equal(events[0].user, "ktb");
  };
  await refused("no proof", "keys_devices", (r) => { delete r.kt; return r; });
  await refused("checkpoint signature", "keys_devices", (r) => {
    const [body, sig] = r.kt.checkpoint.split("\n\n");
    const m = /^(\u2014 \S+ )(\S+)\n$/.exec(sig);
    r.kt.checkpoint = body + "\n\n" + m[1] + flip(m[2], 10) + "\n";
    return r;
  });
  await refused("checkpoint root", "keys_devices", (r) => {
    const lines = r.kt.checkpoint.split("\n");
    lines[2] = flip(lines[2]);
    r.kt.checkpoint = lines.join("\n");
    return r;
  });
  await refused("vrf proof", "keys_devices", (r) => { r.kt.vrf_proof = flip(r.kt.vrf_proof, 40); return r; });
  await refused("another user's label", "keys_devices", (r) => { r.kt.label = flip(r.kt.label); return r; });
  await refused("entry not in the tree", "keys_devices", (r) => { r.kt.entry = flip(r.kt.entry, r.kt.entry.length > 60 ? 45 : 1); return r; });
  await refused("inclusion path", "keys_devices", (r) => { r.kt.proof = r.kt.proof.length ? [flip(r.kt.proof[0]), ...r.kt.proof.slice(1)] : [e.toBase64(new Uint8Array(32))]; return r; });
  await refused("a device not logged", "keys_devices", (r) => {
    r.devices.push({ ...r.devices[0], device_id: "ghost" });
    return r;
  });
  await refused("identity key not logged", "keys_devices", (r) => { r.devices[0].identity_key = flip(r.devices[0].identity_key, 5); return r; });
  await refused("the entry hidden", "keys_devices", (r) => { delete r.kt.entry; delete r.kt.proof; delete r.kt.index; return r; });
  // Another user's (valid) proof for this user.
  const carolKT = (await alice.c.request({ type: "keys_devices", user_id: "ktc" })).kt;
  await refused("another user's proof", "keys_devices", (r) => { r.kt = carolKT; return r; });

  // A bundle answer is checked too.
  {
    const d = await e.Device.open(new e.MemoryStore(), { user: "kta", device: "w-bundle" });
    const chat = new e.E2EChat(tampering(alice.c, "keys_bundle", (r) => { r.bundles[0].identity_key = flip(r.bundles[0].identity_key, 7); return r; }), d);
    await d.importAccountKey(await alice.d.exportAccountKey());
    await assert.rejects(chat.sendDirect(conv, "ktb", "hi"), (err) => err instanceof e.KTError || /bundle|certif/.test(String(err)));
  }

  // A forked log: once a checkpoint is accepted, a newer one must be
  // proven to extend it.
  {
    const d = await e.Device.open(new e.MemoryStore(), { user: "kta", device: "w-fork" });
    let forge = false;
    const client = {
      async request(f, ...rest) {
        const r = await alice.c.request(f, ...rest);
        if (forge && f.type === "kt_consistency") r.kt.proof = r.kt.proof.map((p, i) => (i === 0 ? flip(p) : p));
        return r;
      },
    };
    const chat = new e.E2EChat(client, d);
    assert.deepEqual(await chat.devices("ktb"), ["phone"]);
    const dave = await member("ktd", "phone");
    await dave.chat.publishKeys(2); // the log grows
    forge = true;
    await assert.rejects(chat.devices("ktb", true), (err) => err instanceof e.KTError && err.code === "kt_fork");
    forge = false;
    assert.deepEqual(await chat.devices("ktb", true), ["phone"], "the honest proof then verifies");
  }
});

test("bad input: mangled checkpoints, entries, proofs and keys are refused with a KTError", async () => {
  const a = await member("ktm", "web");
  await a.chat.publishKeys(1);
  const keys = (await a.c.request({ type: "kt_keys" })).kt_keys;
  const kt = (await a.c.request({ type: "keys_devices", user_id: "ktm" })).kt;
  const note = e.parseNoteKey(keys.note_key);
  const vrf = e.fromBase64(keys.vrf_key);
  const c = e.openCheckpoint(note, kt.checkpoint);
  const entry = e.fromBase64(kt.entry);
  const path = (kt.proof ?? []).map(e.fromBase64);
  e.verifyInclusion(c, kt.index ?? 0, entry, path);
  assert.equal(e.parseEntry(entry).devices[0].id, "web");
  assert.deepEqual(e.verifyLabel(vrf, "ktm", e.fromBase64(kt.vrf_proof)), e.fromBase64(kt.label));
  const mangle = (b, i) => {
    const m = b.slice();
    switch (i % 4) {
      case 0: m[(i * 7919) % m.length] ^= 1 << (i % 8); return m;
      case 1: return m.subarray(0, (i * 31) % m.length);
      case 2: return e.concat(m, e.randomBytes(1 + (i % 9)));
      default: return e.randomBytes(1 + ((i * 13) % 300));
    }
  };
  const refuses = (what, f) => {
    try {
      f();
      return false;
    } catch (err) {
      assert.ok(err instanceof e.KTError, `${what}: ${err}`);
      return true;
    }
  };
  const dec = new TextDecoder();
  let refused = 0;
  for (let i = 0; i < 400; i++) {
    const text = dec.decode(mangle(e.utf8(kt.checkpoint), i));
    if (text !== kt.checkpoint) refused += refuses("checkpoint " + i, () => e.openCheckpoint(note, text));
    refuses("note key " + i, () => e.parseNoteKey(dec.decode(mangle(e.utf8(keys.note_key), i))));
    const m = mangle(entry, i);
    // A mangled entry either fails to parse or is not the one in the tree.
    assert.ok(refuses("entry " + i, () => { e.parseEntry(m); e.verifyInclusion(c, kt.index ?? 0, m, path); }), "entry " + i + " accepted");
    assert.ok(refuses("vrf " + i, () => e.verifyLabel(vrf, "ktm", mangle(e.fromBase64(kt.vrf_proof), i))), "vrf proof " + i + " accepted");
  }
  assert.ok(refused > 300, `${refused} mangled checkpoints refused`);
});
