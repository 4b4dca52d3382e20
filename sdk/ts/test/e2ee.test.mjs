// The TypeScript E2E code on its own: libsignal's known-answer vectors
// (the ones client/e2ee's kat_test.go uses) and the protocol's behaviour
// between two TypeScript devices. Go ↔ TypeScript interoperability is
// client/e2ee's TestTypeScriptInterop, which drives test/e2ee-peer.mjs.
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, readdirSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as e from "../dist/e2ee/index.js";
import { FileStore } from "../dist/e2ee/filestore.js";
import { sha256 } from "@noble/hashes/sha2.js";

const h = (s) => e.fromHex(s);

test("KAT: X25519 agreement (libsignal curve25519.rs test_agreement)", () => {
  const a = e.keyPairFromPrivate(h("c806439dc9d2c476ffed8f2580c0888d58ab406bf7ae3698879021b96bb4bf59"));
  const b = e.keyPairFromPrivate(h("b03b34c33a1c44f225b662d2bf4859b8135411fa7b0386d45fb75dc5b91b4466"));
  assert.equal(e.toHex(a.pub), "1bb75966f2e93a3691dfff942bb2a466a1c08b8d78ca3f4d6df8b8bfa2e4ee28");
  assert.equal(e.toHex(b.pub), "653614993d2b15ee9e5fd3d86ce719ef4ec1daae1886a87b3f5fa9565a27a22f");
  const want = "325f239328941ced6e673b86ba41017448e99b649a9c3806c1dd7ca4c477e629";
  assert.equal(e.toHex(e.agree(a.priv, b.pub)), want);
  assert.equal(e.toHex(e.agree(b.priv, a.pub)), want);
  assert.throws(() => e.agree(a.priv, new Uint8Array(32)), { code: "low_order_key" });
});

test("KAT: XEdDSA signature (libsignal curve25519.rs test_signature)", () => {
  const kp = e.keyPairFromPrivate(h("c097248412e58bf05df487968205132794178e367637f5818f81e0e6ce73e865"));
  assert.equal(e.toHex(kp.pub), "ab7e717d4a163b7d9a1d8071dfe9dcf8cdcd1cea3339b6356be84d887e322c64");
  const msg = h("05edce9d9c415ca78cb7252e72c2c4a554d3eb29485a0e1d503118d1a82d99fb4a");
  const sig = h("5de88ca9a89b4a115da79109c67c9c7464a3e4180274f1cb8c63c2984e286dfbede82deb9dcd9fae0bfbb821569b3d9001bd8130cd11d486cef047bd60b86e88");
  assert.ok(e.verify(kp.pub, msg, sig));
  for (let i = 0; i < sig.length; i++) {
    const bad = sig.slice();
    bad[i] ^= 1;
    assert.ok(!e.verify(kp.pub, msg, bad), "bit flipped in byte " + i);
  }
  const own = e.sign(kp.priv, msg);
  assert.ok(e.verify(kp.pub, msg, own));
  assert.ok(!e.verify(kp.pub, e.concat(msg, Uint8Array.of(0)), own));
  for (let i = 0; i < 20; i++) {
    const k = e.generateKeyPair();
    const m = e.randomBytes(33);
    assert.ok(e.verify(k.pub, m, e.sign(k.priv, m)));
  }
});

test("KAT: chain key derivation (libsignal ratchet/keys.rs)", () => {
  const ck = { key: h("8ab72d6f4cc5ac0d387eaf463378ddb28edd07385b1cb01250c715982e7ad48f"), index: 0 };
  const mk = e.deriveMessageKeys(e.messageSeed(ck));
  assert.equal(e.toHex(mk.cipher), "bf51e9d75e0e31031051f82a2491ffc084fa298b7793bd9db620056febf45217");
  assert.equal(e.toHex(mk.mac), "c6c77d6a73a354337a56435e34607dfe48e3ace14e77314dc6abc172e7a7030b");
  const n = e.nextChain(ck);
  assert.equal(e.toHex(n.key), "28e8f8fee54b801eef7c5cfb2f17f32c7b334485bbb70fac6ec10342a246d15d");
  assert.equal(n.index, 1);
});

// tests/ratchet.rs at a280bc655: X3DH (version 3) sessions.
const v = {
  bobEphPub: "052cb49776b8770205745a3a6e24f579cdb4ba7a89041005928ebbadc9c05ad458",
  bobEphPriv: "a1cab48f7c893fafa9880a28c3b4999d28d6329562d27a4ea4e22e9ff1bdd65a",
  bobIDPub: "05f1f43874f6966956c2dd473f8fa15adeb71d1cb991b2341692324cefb1c5e626",
  bobIDPriv: "4875cc69ddf8ea0719ec947d61081135868d5fd801f02c0225e516df2156605e",
  aliceBasePub: "05e2c05860f2ac6b2b57ba564b421ffe71e4b128c591e46e0491cc9b33dbf22a27",
  aliceBasePriv: "10ae7c64d1e61cd596b76a0db5012673391cae66edbfcf073b4da80516a47449",
  aliceIDPub: "05b4a8455660ada65b401007f615e654041746432e3339c6875149bceefcb42b4a",
  aliceIDPriv: "9040f0d4e09cf38f6dc7c13779c908c015a1da4fa78737a080eb0a6f4f5f8f58",
  bobSPKPub: "05ac248a8f263be6863576eb0362e28c828f0107a3379d34bab1586bf8c770cd67",
  bobSPKPriv: "583900131fb727998b7803fe6ac22cc591f342e4e42a8c8d5d78194209b8d253",
  chain: "ab9be50e5cb22a925446ab90ee5670545f4fd32902459ec274b6ad0ae5d6031a",
};
// Taken as given, like libsignal's KeyPair::from_public_and_private.
const pair = (pub, priv) => ({ pub: e.decodeKey(h(pub)), priv: e.clamp(h(priv)) });

test("KAT: X3DH v3 session as Bob (libsignal tests/ratchet.rs)", () => {
  const st = e.bobSession({
    identity: pair(v.bobIDPub, v.bobIDPriv),
    signedPreKey: pair(v.bobSPKPub, v.bobSPKPriv),
    ratchet: pair(v.bobEphPub, v.bobEphPriv),
    theirIdentity: e.decodeKey(h(v.aliceIDPub)),
    theirBaseKey: e.decodeKey(h(v.aliceBasePub)),
  });
  assert.equal(st.version, 3);
  assert.equal(e.toHex(st.sender.chain.key), v.chain);
});

test("KAT: X3DH v3 session as Alice (libsignal tests/ratchet.rs)", () => {
  const bobEph = e.decodeKey(h(v.bobEphPub));
  const { state } = e.aliceSession({
    identity: pair(v.aliceIDPub, v.aliceIDPriv),
    base: pair(v.aliceBasePub, v.aliceBasePriv),
    theirIdentity: e.decodeKey(h(v.bobIDPub)),
    theirSignedPreKey: e.decodeKey(h(v.bobSPKPub)),
    theirRatchet: bobEph,
  });
  assert.equal(state.version, 3);
  const rc = state.receivers.find((r) => e.equal(r.ratchetKey, bobEph));
  assert.equal(e.toHex(rc.chain.key), v.chain);
});

// bundleOf is what the key directory hands out from an upload: the
// signed prekey, the last-resort (or a one-time) KEM key and a one-time
// prekey when asked.
export function bundleOf(self, up, { oneTime = true, kem = "one-time" } = {}) {
  return {
    ...self,
    registrationId: up.registrationId,
    identityKey: up.identityKey,
    signedPreKey: up.signedPreKey,
    preKey: oneTime ? up.preKeys.shift() : undefined,
    kemPreKey: kem === "none" ? undefined : kem === "last-resort" ? up.lastResortKEM : up.kemPreKeys.shift(),
  };
}

async function pairOfDevices() {
  const A = { user: "alice", device: "web" };
  const B = { user: "bob", device: "phone" };
  const a = await e.Device.open(new e.MemoryStore(), A);
  const b = await e.Device.open(new e.MemoryStore(), B);
  const up = await b.generateKeys(3);
  return { A, B, a, b, up };
}

const txt = (s) => e.utf8(s);
const str = (b) => new TextDecoder().decode(b);

test("PQXDH session: first messages, answer, ratchet, out of order, duplicate, too far", async () => {
  const { A, B, a, b, up } = await pairOfDevices();
  await a.processBundle(bundleOf(B, up));
  const m1 = await a.encrypt(B, txt("one"));
  const m2 = await a.encrypt(B, txt("two"));
  assert.equal(m1.type, e.TYPE_PREKEY);
  assert.equal(m1.body[0], 0x44); // version 4 (PQXDH)
  assert.equal(str(await b.decrypt(A, m2.type, m2.body)), "two"); // out of order
  assert.equal(str(await b.decrypt(A, m1.type, m1.body)), "one");
  await assert.rejects(b.decrypt(A, m1.type, m1.body), { code: "duplicate" });
  const r = await b.encrypt(A, txt("answer"));
  assert.equal(r.type, e.TYPE_SIGNAL);
  assert.equal(str(await a.decrypt(B, r.type, r.body)), "answer");
  const later = [];
  for (let i = 0; i < 5; i++) later.push(await a.encrypt(B, txt("m" + i)));
  assert.equal(later[0].type, e.TYPE_SIGNAL);
  for (const i of [4, 1, 3, 0, 2]) assert.equal(str(await b.decrypt(A, later[i].type, later[i].body)), "m" + i);
  // A tampered message fails and changes nothing.
  const next = await a.encrypt(B, txt("next"));
  const bad = next.body.slice();
  bad[bad.length - 1] ^= 1;
  await assert.rejects(b.decrypt(A, next.type, bad), { code: "bad_mac" });
  assert.equal(str(await b.decrypt(A, next.type, next.body)), "next");
});

test("too far ahead: a counter beyond 25,000 skipped keys is refused", async () => {
  const { A, B, a, b, up } = await pairOfDevices();
  await a.processBundle(bundleOf(B, up));
  const first = await a.encrypt(B, txt("hi"));
  await b.decrypt(A, first.type, first.body);
  const r = await b.encrypt(A, txt("ok"));
  await a.decrypt(B, r.type, r.body);
  // Encrypt on a copy of Alice's session whose chain index is far ahead.
  const rec = e.decodeJSON(await a.store.load("session/" + e.addr(B)));
  const st = rec.current;
  st.sender.chain = { key: e.randomBytes(32), index: e.MAX_FORWARD_JUMP + 1 };
  const far = await e.encryptOn(st, txt("far"));
  await assert.rejects(b.decrypt(A, far.type, far.body), { code: "too_far_ahead" });
});

test("bundles: bad signature, downgrade, replayed first message, used one-time key", async () => {
  const { A, B, a, b, up } = await pairOfDevices();
  const bundle = bundleOf(B, up);
  const forged = { ...bundle, signedPreKey: { ...bundle.signedPreKey, sig: e.randomBytes(64) } };
  await assert.rejects(a.processBundle(forged), { code: "bad_signature" });
  await assert.rejects(a.processBundle({ ...bundle, kemPreKey: undefined }), { code: "downgrade" });
  // Last-resort KEM key, no one-time prekey: a replay is caught by the base key.
  await a.processBundle(bundleOf(B, up, { oneTime: false, kem: "last-resort" }));
  const m = await a.encrypt(B, txt("first"));
  assert.equal(str(await b.decrypt(A, m.type, m.body)), "first");
  await b.reset(A);
  await assert.rejects(b.decrypt(A, m.type, m.body), { code: "reused_base_key" });
  // A one-time prekey is consumed.
  const a2 = await e.Device.open(new e.MemoryStore(), { user: "alice", device: "laptop" });
  const A2 = { user: "alice", device: "laptop" };
  await a2.processBundle(bundle);
  const m2 = await a2.encrypt(B, txt("x"));
  await b.decrypt(A2, m2.type, m2.body);
  await b.reset(A2);
  await assert.rejects(b.decrypt(A2, m2.type, m2.body), { code: "invalid_prekey" });
});

test("sender keys: out of order, duplicate, rotation after a member leaves", async () => {
  const S = { user: "alice", device: "web" };
  const s = await e.Device.open(new e.MemoryStore(), S);
  const r1 = await e.Device.open(new e.MemoryStore(), { user: "bob", device: "p" });
  const r2 = await e.Device.open(new e.MemoryStore(), { user: "carol", device: "p" });
  const skdm = await s.groupDistribution("g1");
  await r1.processGroupDistribution("g1", S, skdm);
  await r2.processGroupDistribution("g1", S, skdm);
  const g = [];
  for (let i = 0; i < 4; i++) g.push(await s.groupEncrypt("g1", txt("g" + i)));
  for (const i of [2, 0, 3, 1]) assert.equal(str(await r1.groupDecrypt("g1", S, g[i])), "g" + i);
  await assert.rejects(r1.groupDecrypt("g1", S, g[0]), { code: "duplicate" });
  const bad = g[0].slice();
  bad[bad.length - 65] ^= 1; // in the ciphertext
  await assert.rejects(r2.groupDecrypt("g1", S, bad), { code: "bad_signature" });
  // carol leaves: a new sender key goes to bob only.
  await s.rotateGroup("g1");
  const skdm2 = await s.groupDistribution("g1");
  await r1.processGroupDistribution("g1", S, skdm2);
  const after = await s.groupEncrypt("g1", txt("after"));
  assert.equal(str(await r1.groupDecrypt("g1", S, after)), "after");
  await assert.rejects(r2.groupDecrypt("g1", S, after), { code: "no_sender_key" });
  // Legacy format round trip.
  const l = await s.groupDistribution("g2", "legacy");
  await r1.processGroupDistribution("g2", S, l, "legacy");
  assert.equal(str(await r1.groupDecrypt("g2", S, await s.groupEncrypt("g2", txt("old"), "legacy"), "legacy")), "old");
});

test("account key, device certificates and safety numbers", async () => {
  const A = { user: "alice", device: "web" };
  const a = await e.Device.open(new e.MemoryStore(), A);
  const a2 = await e.Device.open(new e.MemoryStore(), { user: "alice", device: "cli" });
  const obs = await e.Device.open(new e.MemoryStore(), { user: "bob", device: "p" });
  const ak = await a.createAccountKey();
  const exported = await a.exportAccountKey();
  assert.match(exported, /^parley-account-key-v1 [A-Za-z0-9+/]+=*\n$/);
  assert.ok(e.equal(await a2.importAccountKey(exported), ak));
  const cert = async (d) => ({ ...d.self, identityKey: d.identityKey, ...(await d.deviceCertificate()) });
  const list = [await cert(a), await cert(a2)];
  const chk = await obs.acceptDevices("alice", list);
  assert.equal(chk.accepted.length, 2);
  assert.ok(await obs.certified(A, a.identityKey));
  // A device the server adds under another account key is refused.
  const rogue = await e.Device.open(new e.MemoryStore(), { user: "alice", device: "rogue" });
  await rogue.createAccountKey();
  const chk2 = await obs.acceptDevices("alice", [...list, await cert(rogue)]);
  assert.equal(chk2.accepted.length, 2);
  assert.equal(chk2.refused.length, 1);
  await assert.rejects(obs.acceptDevice(await cert(rogue)), { code: "bad_certificate" });
  const n1 = e.safetyNumber("alice", ak, "bob", e.generateKeyPair().pub);
  assert.match(n1, /^\d{60}$/);
  assert.equal(e.formatSafetyNumber(n1).split(" ").length, 12);
});

test("envelope: the server's shape, both ways", () => {
  const env = { to: [{ user: "bob", device: "phone", type: 3, body: Uint8Array.of(1, 2) }], group: Uint8Array.of(7) };
  const s = e.encodeEnvelope(env);
  assert.equal(s, '{"e2e":1,"to":[{"user":"bob","device":"phone","type":3,"body":"AQI="}],"group":"Bw=="}');
  assert.deepEqual(e.parseEnvelope(s).to[0].body, Uint8Array.of(1, 2));
  for (const bad of ["hello", '{"e2e":2,"group":"Bw=="}', '{"e2e":1}', '{"e2e":1,"group":"Bw==","text":"hi"}', '{"e2e":1,"to":[{"user":"b","device":"p","type":5,"body":"AQ=="}]}']) {
    assert.throws(() => e.parseEnvelope(bad), { code: "malformed" }, bad);
  }
});

test("FileStore: 0600 files in a 0700 directory, locked, batches replayed after a crash", async () => {
  const dir = mkdtempSync(join(tmpdir(), "parley-e2ee-"));
  const st = await FileStore.open(dir);
  await assert.rejects(FileStore.open(dir), { code: "locked" });
  const d = await e.Device.open(st, { user: "u", device: "d" });
  await d.generateKeys(1);
  assert.equal(statSync(dir).mode & 0o777, 0o700);
  for (const f of readdirSync(dir)) if (!f.startsWith(".lock")) assert.equal(statSync(join(dir, f)).mode & 0o777, 0o600, f);
  assert.deepEqual(await st.list("prekey/"), ["prekey/1"]);
  await st.close();
  // A crash after the journal was written: opening applies it whole.
  writeFileSync(join(dir, ".journal"), e.encodeJSON([{ key: "a/b", value: Uint8Array.of(1) }, { key: "prekey/1", value: null }]));
  const st2 = await FileStore.open(dir);
  assert.deepEqual(await st2.load("a/b"), Uint8Array.of(1));
  assert.equal(await st2.load("prekey/1"), null);
  const d2 = await e.Device.open(st2, { user: "u", device: "d" });
  assert.ok(e.equal(d2.identityKey, d.identityKey));
  await st2.close();
});

test("attachments: Signal's scheme — padding buckets, digest and MAC checked before decryption", async () => {
  assert.equal(e.paddedSize(0), 541);
  assert.equal(e.paddedSize(541), 541);
  assert.ok(e.paddedSize(100000) >= 100000 && e.paddedSize(100000) < 105000);
  for (const n of [0, 1, 15, 16, 541, 542, 5000]) {
    const plain = e.randomBytes(n);
    const key = e.newAttachmentKey();
    const { data, digest } = await e.encryptAttachment(plain, key);
    assert.equal(data.length, e.encryptedSize(n), "size " + n);
    assert.deepEqual(await e.decryptAttachment(data, key, digest, n), plain);
    const flipped = data.slice();
    flipped[20] ^= 1;
    await assert.rejects(e.decryptAttachment(flipped, key, digest, n), { code: "attachment_digest" });
    await assert.rejects(e.decryptAttachment(flipped, key, sha256(flipped), n), { code: "attachment_mac" });
    await assert.rejects(e.decryptAttachment(data, key, digest, data.length), { code: "attachment_format" });
  }
});

test("bad input: mangled messages are refused with an E2EE error and change nothing", async () => {
  const { A, B, a, b, up } = await pairOfDevices();
  await a.processBundle(bundleOf(B, up));
  const mangle = (body, i) => {
    const m = body.slice();
    switch (i % 4) {
      case 0: m[(i * 7919) % m.length] ^= 1 << (i % 8); return m;
      case 1: return m.subarray(0, (i * 31) % m.length);
      case 2: return e.concat(m, e.randomBytes(1 + (i % 9)));
      default: return e.randomBytes(1 + ((i * 13) % 300));
    }
  };
  // Each mangled copy is refused with an E2EEError, or (a change the
  // format ignores: the low nibble of the version byte, an unknown
  // protobuf field) opens to the same plaintext; either way the stored
  // state is as before: the original opens once, then is a duplicate.
  async function attack(open, original, want, rounds) {
    let accepted = false;
    for (let i = 0; i < rounds; i++) {
      try {
        const got = await open(mangle(original, i));
        assert.equal(str(got), want, "round " + i + " opened to another plaintext");
        accepted = true;
      } catch (err) {
        assert.ok(err instanceof e.E2EEError, `round ${i}: ${err}`);
      }
    }
    if (accepted) await assert.rejects(open(original), { code: "duplicate" });
    else assert.equal(str(await open(original)), want);
  }
  const first = await a.encrypt(B, txt("first"));
  await attack((m) => b.decrypt(A, first.type, m), first.body, "first", 200);
  const x = await a.encrypt(B, txt("x"));
  await attack((m) => b.decrypt(A, x.type, m), x.body, "x", 50);
  const r = await b.encrypt(A, txt("ok"));
  await a.decrypt(B, r.type, r.body);
  const next = await a.encrypt(B, txt("next"));
  await attack((m) => b.decrypt(A, next.type, m), next.body, "next", 200);
  // Group messages. (A distribution comes inside a pairwise message,
  // authenticated there; its parser only has to refuse cleanly.)
  const skdm = await a.groupDistribution("g");
  for (let i = 0; i < 100; i++) {
    try {
      e.parseDistribution(mangle(skdm, i), "modern");
    } catch (err) {
      assert.ok(err instanceof e.E2EEError, `skdm round ${i}: ${err}`);
    }
  }
  await b.processGroupDistribution("g", A, skdm);
  const g = await a.groupEncrypt("g", txt("group"));
  await attack((m) => b.groupDecrypt("g", A, m), g, "group", 200);
});
