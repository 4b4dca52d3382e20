// A TypeScript E2E peer driven over stdio, for client/e2ee's
// TestTypeScriptInterop: one JSON request per line on stdin
// ({"id":N,"op":"…","dev":"user/device",…}, bytes as standard base64),
// one JSON answer per line on stdout ({"id":N,"ok":true,"r":…} or
// {"id":N,"ok":false,"code":"…","error":"…"}). Devices live in memory, or
// in a FileStore when "open" names a directory.
import { createInterface } from "node:readline";
import * as e from "../dist/e2ee/index.js";
import { FileStore } from "../dist/e2ee/filestore.js";
import { Client } from "../dist/index.js";
import WebSocket from "ws";

const devs = new Map();
const b64 = (s) => (s === undefined || s === null ? undefined : e.fromBase64(s));
const out = (v) => (v instanceof Uint8Array ? e.toBase64(v) : v);
const dev = (name) => {
  const d = devs.get(name);
  if (!d) throw new Error("no device " + name);
  return d;
};
const address = (s) => {
  const [user, device] = s.split("/");
  return { user, device };
};
const key = (s) => e.decodeKey(b64(s)); // a serialized (33-byte) key
const pre = (p) => p && { id: p.id, key: b64(p.key), sig: b64(p.sig) };

const ops = {
  async open(q) {
    const st = q.dir ? await FileStore.open(q.dir) : new e.MemoryStore();
    const d = await e.Device.open(st, address(q.dev));
    devs.set(q.dev, d);
    return { identityKey: e.serializeKey(d.identityKey), registrationId: d.registrationId };
  },
  async close(q) {
    await dev(q.dev).store.close?.();
    devs.delete(q.dev);
    return {};
  },
  async setAllowX3DH(q) {
    dev(q.dev).allowX3DH = !!q.allow;
    return {};
  },
  async generateKeys(q) {
    const up = await dev(q.dev).generateKeys(q.n);
    const kem = (k) => k && { id: k.id, key: k.key, sig: k.sig };
    return {
      registrationId: up.registrationId,
      identityKey: e.serializeKey(up.identityKey),
      signedPreKey: up.signedPreKey && { id: up.signedPreKey.id, key: e.serializeKey(up.signedPreKey.key), sig: up.signedPreKey.sig },
      preKeys: up.preKeys.map((p) => ({ id: p.id, key: e.serializeKey(p.key) })),
      kemPreKeys: up.kemPreKeys.map(kem),
      lastResortKEM: kem(up.lastResortKEM),
    };
  },
  async processBundle(q) {
    const b = q.bundle;
    const spk = pre(b.signedPreKey);
    await dev(q.dev).processBundle({
      ...address(b.address),
      registrationId: b.registrationId,
      identityKey: key(b.identityKey),
      signedPreKey: { ...spk, key: e.decodeKey(spk.key) },
      preKey: b.preKey ? { id: b.preKey.id, key: key(b.preKey.key) } : undefined,
      kemPreKey: b.kemPreKey ? pre(b.kemPreKey) : undefined,
    });
    return {};
  },
  async encrypt(q) {
    return dev(q.dev).encrypt(address(q.peer), b64(q.plain));
  },
  async decrypt(q) {
    return { plain: await dev(q.dev).decrypt(address(q.peer), q.type, b64(q.body)) };
  },
  // seal: one envelope to several devices ({"e2e":1,"to":[…]}), as a
  // message body carries it.
  async seal(q) {
    const d = dev(q.dev);
    const to = [];
    for (const p of q.peers) {
      const r = await d.encrypt(address(p), b64(q.plain));
      to.push({ ...address(p), type: r.type, body: r.body });
    }
    return { envelope: e.encodeEnvelope({ to, group: b64(q.group) }) };
  },
  // open: this device's ciphertext of an envelope, decrypted.
  async open_envelope(q) {
    const d = dev(q.dev);
    const env = e.parseEnvelope(q.envelope);
    const mine = e.forDevice(env, d.self.user, d.self.device);
    if (!mine) throw Object.assign(new Error("no ciphertext for this device"), { code: "not_for_device" });
    return { plain: await d.decrypt(address(q.sender), mine.type, mine.body) };
  },
  async groupDistribution(q) {
    return { skdm: await dev(q.dev).groupDistribution(q.group, q.format) };
  },
  async processGroupDistribution(q) {
    await dev(q.dev).processGroupDistribution(q.group, address(q.sender), b64(q.skdm), q.format);
    return {};
  },
  async groupEncrypt(q) {
    return { body: await dev(q.dev).groupEncrypt(q.group, b64(q.plain), q.format) };
  },
  async groupDecrypt(q) {
    return { plain: await dev(q.dev).groupDecrypt(q.group, address(q.sender), b64(q.body), q.format) };
  },
  async rotateGroup(q) {
    await dev(q.dev).rotateGroup(q.group);
    return {};
  },
  async importAccountKey(q) {
    return { accountKey: e.serializeKey(await dev(q.dev).importAccountKey(q.key)) };
  },
  async createAccountKey(q) {
    return { accountKey: e.serializeKey(await dev(q.dev).createAccountKey()) };
  },
  async exportAccountKey(q) {
    return { key: await dev(q.dev).exportAccountKey() };
  },
  async deviceCertificate(q) {
    const d = dev(q.dev);
    const c = await d.deviceCertificate();
    return { identityKey: e.serializeKey(d.identityKey), accountKey: c.accountKey, sig: c.sig };
  },
  async acceptDevices(q) {
    const certs = q.certs.map((c) => ({ ...address(c.address), identityKey: key(c.identityKey), accountKey: b64(c.accountKey), sig: b64(c.sig) }));
    const chk = await dev(q.dev).acceptDevices(q.user, certs);
    return { accepted: chk.accepted.map(e.addr), refused: chk.refused.map(e.addr), changed: !!chk.change };
  },
  async sign(q) {
    return { sig: e.sign(b64(q.priv), b64(q.msg)) };
  },
  async verify(q) {
    return { ok: e.verify(key(q.pub), b64(q.msg), b64(q.sig)) };
  },
  async attachEncrypt(q) {
    return e.encryptAttachment(b64(q.plain), b64(q.key));
  },
  async attachDecrypt(q) {
    return { plain: await e.decryptAttachment(b64(q.data), b64(q.key), b64(q.digest), q.size) };
  },
  async safetyNumber(q) {
    return { number: e.safetyNumber(q.localId, key(q.localKey), q.remoteId, key(q.remoteKey)) };
  },
};

// E2E chats on a real server: a Client, its Device and an E2EChat per
// device name.
const chats = new Map();
const chat = (name) => {
  const c = chats.get(name);
  if (!c) throw new Error("no chat " + name);
  return c;
};
Object.assign(ops, {
  async chatStart(q) {
    const { user, device } = address(q.dev);
    const client = new Client({ url: q.url, token: q.token, device, WebSocket, minBackoffMs: 50, maxBackoffMs: 1000 });
    const up = new Promise((res) => client.on("connected", res));
    client.start();
    await up;
    const d = await e.Device.open(new e.MemoryStore(), { user, device });
    if (q.accountKey) await d.importAccountKey(q.accountKey);
    const c = new e.E2EChat(client, d);
    chats.set(q.dev, { client, d, c });
    return { identityKey: e.serializeKey(d.identityKey) };
  },
  async chatAccountKey(q) {
    const { d } = chat(q.dev);
    if (!(await d.accountKey())) await d.createAccountKey();
    return { key: await d.exportAccountKey() };
  },
  async chatPublish(q) {
    return chat(q.dev).c.publishKeys(q.n);
  },
  async chatSend(q) {
    const { c } = chat(q.dev);
    const ack = q.peer ? await c.sendDirect(q.conv, q.peer, q.text) : q.members ? await c.sendGroup(q.conv, q.members, q.text) : await c.send(q.conv, q.text);
    return { seq: ack.seq };
  },
  // chatRead opens every message of the conversation's history in order.
  async chatRead(q) {
    const { client, c } = chat(q.dev);
    const { messages } = await client.history(q.conv, { afterSeq: 0, limit: 200 });
    const out = [];
    for (const m of messages) {
      try {
        const o = await c.open(m);
        out.push({ seq: m.seq, kind: o.kind, text: o.text ?? "", control: !!o.control, system: o.system?.event ?? "" });
      } catch (err) {
        out.push({ seq: m.seq, kind: m.kind, error: err.code ?? String(err.message) });
      }
    }
    return { messages: out };
  },
  async chatOpen(q) {
    try {
      const o = await chat(q.dev).c.open(q.message);
      return { text: o.text ?? "" };
    } catch (err) {
      return { error: err.code ?? String(err.message) };
    }
  },
  async chatSafetyNumber(q) {
    return { number: await chat(q.dev).c.safetyNumber(q.user) };
  },
  async chatStop(q) {
    chat(q.dev).client.close();
    chats.delete(q.dev);
    return {};
  },
});

const rl = createInterface({ input: process.stdin });
let chain = Promise.resolve();
rl.on("close", () => {
  chain.then(() => {
    for (const { client } of chats.values()) client.close();
  });
});
rl.on("line", (line) => {
  chain = chain.then(async () => {
    let q;
    try {
      q = JSON.parse(line);
      const f = ops[q.op];
      if (!f) throw new Error("unknown op " + q.op);
      const r = await f(q);
      process.stdout.write(JSON.stringify({ id: q.id, ok: true, r: r ?? {} }, (_k, v) => out(v)) + "\n");
    } catch (err) {
      process.stdout.write(JSON.stringify({ id: q?.id, ok: false, code: err.code ?? "", error: String(err.message ?? err) }) + "\n");
    }
  });
});
