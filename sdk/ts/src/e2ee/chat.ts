// E2EChat connects a Device to a Parley Client, as client/e2eechat
// connects client/e2ee to the Go client: it publishes the device's keys
// with its certificate by the account key, reads users' device lists and
// accepts only the devices that key certifies, fetches bundles, encrypts
// to every device of the recipients and of this user's other devices,
// distributes Sender Keys in groups (rotated when a member leaves), and
// opens what arrives. The content inside the encryption is e2eechat's
// ({"t":"text","text":…,"conv","kind","target","from","dev","ctr"}: the
// labels the server shows, sealed by the author) and open refuses a
// message whose labels differ, an edit or recall of someone else's
// message, and a content replayed under another seq. Decrypted messages
// are kept in the Store, where search looks (the server of an E2E
// conversation cannot).
//
// Key transparency as client/e2eechat checks it: the log's keys pinned on
// first use, every device list and bundle answer proven in a signed
// checkpoint (the user's VRF label, the entry's inclusion, the devices
// as logged, no older entry than one seen), each checkpoint consistent
// with the last one accepted. Not here yet: the checkpoint gossiped
// inside messages, the monitoring of this user's own entries, and files.

import type { Ack, Client } from "../client.js";
import type { ConvInfo, DeviceKeyInfo, KeyBundle, KTKeys, KTProof, Message, SBundles, SConv, SDevices, SKeys } from "../frames.js";
import { Checkpoint, KTError, NoteKey, openCheckpoint, parseEntry, parseNoteKey, verifyConsistency, verifyInclusion, verifyLabel } from "./kt.js";
import { decodeJSON, encodeJSON, fromBase64, fromUtf8, toBase64, toHex, utf8 } from "./bytes.js";
import { decodeKey, serializeKey } from "./curve.js";
import { Address, addr, Bundle, Device, DeviceCheck } from "./device.js";
import { encodeEnvelope, EnvelopeTo, forDevice, parseEnvelope } from "./envelope.js";
import { E2EEError, fail } from "./errors.js";
import { safetyNumber } from "./fingerprint.js";
import { parseDistribution, parsePreKeySignalMessage, TYPE_PREKEY } from "./messages.js";
import type { Store } from "./store.js";
import { sha256 } from "@noble/hashes/sha2.js";

// Limits of the server's frames (protocol/e2e.go).
const MAX_UPLOAD_PREKEYS = 20; // per kind and keys_upload (the KEM bound)
const MAX_ENVELOPE_TO = 200;
const ENVELOPE_BUDGET = 12 << 10;
const ROTATE_PENDING = "rotate/pending";

// Signal's schedule (client/e2eechat.DefaultRotation): the signed prekey
// and the last-resort KEM key every two days, replaced ones kept 30 days.
export const DEFAULT_ROTATION = { everyMs: 48 * 3600_000, graceMs: 30 * 24 * 3600_000 };

// Errors of open, by code (client/e2eechat's of the same meaning).
export class ChatError extends Error {
  constructor(
    readonly code: "not_for_device" | "own_unknown" | "metadata_mismatch" | "unbound" | "unauthenticated_recall" | "uncertified",
    message: string,
    readonly field?: string,
  ) {
    super("e2eechat: " + message);
    this.name = "ChatError";
  }
}

// Content is what travels inside the encryption.
interface Content {
  t: "text" | "skdm" | "recall" | "file";
  text?: string;
  skdm?: string; // base64, as Go's []byte
  conv?: string;
  kind?: string;
  target?: number;
  from?: string;
  dev?: string;
  ctr?: number;
  kt?: unknown;
}

interface Kept {
  from?: string;
  dev?: string;
  kind?: string;
  target?: number;
  text?: string;
  recalled?: boolean;
}

export interface Opened {
  convId: string;
  seq: number;
  sender: string;
  senderDevice?: string;
  kind: string;
  targetSeq?: number;
  text?: string;
  // control: a protocol message (a sender key distribution) not shown.
  control?: boolean;
  recalled?: boolean;
  system?: { event: string; users?: string[] };
}

export interface Hit {
  convId: string;
  seq: number;
  text: string;
}

export interface IdentityEvent {
  user: string;
  check: DeviceCheck;
}

const keptKey = (conv: string, seq: number) => `kept/${conv}/${seq}`;
const ownKey = (conv: string, cmid: string) => `own/${conv}/${cmid}`;
const distKey = (conv: string, chain: number) => `skdist/${conv}/${chain}`;

function newCmid(): string {
  const c = globalThis.crypto as Crypto & { randomUUID?: () => string };
  return c.randomUUID ? c.randomUUID() : toHex(c.getRandomValues(new Uint8Array(16)));
}

interface KTDevice {
  id: string;
  identityKey: Uint8Array;
  accountKey: Uint8Array;
  sig: Uint8Array;
}

export class E2EChat {
  private devs = new Map<string, string[]>();
  private ktQueue: Promise<unknown> = Promise.resolve();
  private ktKeys?: { note: NoteKey; vrf: Uint8Array } | null; // null: the server keeps no log
  // onKT is told of every answer whose key transparency proof failed.
  onKT?: (ev: { user: string; error: KTError }) => void;
  private queue: Promise<unknown> = Promise.resolve();
  readonly self: Address;
  // onIdentity is told of every device list with a refused device or a
  // changed account key.
  onIdentity?: (ev: IdentityEvent) => void;

  constructor(
    readonly client: Pick<Client, "request">,
    readonly device: Device,
    readonly store: Store = device.store,
  ) {
    this.self = device.self;
  }

  private async load<T>(key: string): Promise<T | undefined> {
    const b = await this.store.load(key);
    return b ? decodeJSON<T>(b) : undefined;
  }
  private save(key: string, v: unknown): Promise<void> {
    return this.store.batch([{ key, value: encodeJSON(v) }]);
  }

  // publishKeys makes n one-time prekeys of each kind (and the signed and
  // last-resort keys on first use) and uploads them with the device's
  // certificate, creating the account key if the device has none (the
  // account's first device; the others importAccountKey first).
  async publishKeys(n = 20): Promise<{ prekeys: number; kem_prekeys: number }> {
    const up = await this.device.generateKeys(n);
    if (!up.signedPreKey || !up.lastResortKEM) {
      // Made by an earlier call whose upload failed (an account
      // conflict before the device was linked): a first upload needs them.
      const cur = await this.device.publicKeys();
      up.signedPreKey ??= cur.signedPreKey;
      up.lastResortKEM ??= cur.lastResortKEM;
    }
    if (!(await this.device.accountKey())) await this.device.createAccountKey();
    const cert = await this.device.deviceCertificate();
    const pk = (k: { id: number; key: Uint8Array; sig?: Uint8Array }) => ({ id: k.id, key: toBase64(k.key), ...(k.sig ? { sig: toBase64(k.sig) } : {}) });
    let batch: Record<string, unknown> = {
      registration_id: up.registrationId,
      identity_key: toBase64(serializeKey(up.identityKey)),
      account_key: toBase64(cert.accountKey),
      device_sig: toBase64(cert.sig),
    };
    if (up.signedPreKey) batch.signed_prekey = pk({ ...up.signedPreKey, key: serializeKey(up.signedPreKey.key) });
    if (up.lastResortKEM) batch.last_resort_kem = pk(up.lastResortKEM);
    let pre = up.preKeys.map((p) => pk({ id: p.id, key: serializeKey(p.key) }));
    let kem = up.kemPreKeys.map(pk);
    for (;;) {
      batch.prekeys = pre.slice(0, MAX_UPLOAD_PREKEYS);
      batch.kem_prekeys = kem.slice(0, MAX_UPLOAD_PREKEYS);
      pre = pre.slice(MAX_UPLOAD_PREKEYS);
      kem = kem.slice(MAX_UPLOAD_PREKEYS);
      const r = (await this.client.request({ type: "keys_upload", keys: batch }, true)) as SKeys;
      this.devs.delete(this.self.user);
      if (pre.length === 0 && kem.length === 0) return r.counts;
      batch = {};
    }
  }

  // maintain keeps the published keys fresh, as client/e2eechat's
  // Maintain: the signed prekey and the last-resort KEM key are replaced
  // once older than rotation.everyMs and uploaded (a mark stored first,
  // so a failed upload is retried by the next call), then the keys
  // replaced more than rotation.graceMs ago are deleted. Call it at start
  // and then hourly.
  async maintain(rotation: { everyMs: number; graceMs: number } = DEFAULT_ROTATION): Promise<void> {
    const due = await this.device.rotationDue(rotation.everyMs);
    let pending = await this.store.load(ROTATE_PENDING);
    if (due.signed || due.lastResort) {
      await this.store.batch([{ key: ROTATE_PENDING, value: Uint8Array.of(1) }]);
      pending = Uint8Array.of(1);
      if (due.signed) await this.device.rotateSignedPreKey();
      if (due.lastResort) await this.device.rotateLastResortKEM();
    }
    if (pending) {
      const up = await this.device.publicKeys();
      if (!up.signedPreKey || !up.lastResortKEM) throw fail("invalid_prekey", "unknown prekey id: no signed prekey or last-resort KEM key yet");
      await this.client.request(
        {
          type: "keys_upload",
          keys: {
            signed_prekey: { id: up.signedPreKey.id, key: toBase64(serializeKey(up.signedPreKey.key)), sig: toBase64(up.signedPreKey.sig) },
            last_resort_kem: { id: up.lastResortKEM.id, key: toBase64(up.lastResortKEM.key), sig: toBase64(up.lastResortKEM.sig) },
          },
        },
        true,
      );
      await this.store.batch([{ key: ROTATE_PENDING, value: null }]);
    }
    await this.device.pruneRetiredKeys(rotation.graceMs);
  }

  // devices: the devices of user with keys that the account key this
  // device trusts for user certifies (fresh when refresh or not cached).
  async devices(user: string, refresh = false): Promise<string[]> {
    const cached = this.devs.get(user);
    if (cached && !refresh) return cached;
    const r = (await this.client.request({ type: "keys_devices", user_id: user }, true)) as SDevices;
    await this.ktVerify(user, r.kt, (r.devices ?? []).map((d) => ({ id: d.device_id, identityKey: fromBase64(d.identity_key), accountKey: fromBase64(d.account_key ?? ""), sig: fromBase64(d.device_sig ?? "") })));
    const certs = (r.devices ?? []).map((d: DeviceKeyInfo) => {
      let identityKey: Uint8Array = new Uint8Array(32);
      let sig: Uint8Array = d.device_sig ? fromBase64(d.device_sig) : new Uint8Array();
      try {
        identityKey = decodeKey(fromBase64(d.identity_key));
      } catch {
        sig = new Uint8Array(); // refused below
      }
      return { user, device: d.device_id, identityKey, accountKey: d.account_key ? fromBase64(d.account_key) : new Uint8Array(), sig };
    });
    let chk: DeviceCheck;
    try {
      chk = await this.device.acceptDevices(user, certs);
    } catch (e) {
      const c = (e as { check?: DeviceCheck }).check;
      if (c) this.onIdentity?.({ user, check: c });
      throw e;
    }
    if (chk.refused.length || chk.change) this.onIdentity?.({ user, check: chk });
    const ids = chk.accepted.map((c) => c.device).sort();
    this.devs.set(user, ids);
    return ids;
  }

  private async fetchBundle(a: Address): Promise<KeyBundle> {
    const r = (await this.client.request({ type: "keys_bundle", user_id: a.user, device_id: a.device })) as SBundles;
    const bs = r.bundles ?? [];
    if (bs.length !== 1 || bs[0].user_id !== a.user || bs[0].device_id !== a.device) throw new Error("e2eechat: no bundle for " + addr(a));
    await this.ktVerify(a.user, r.kt, bs.map((b) => ({ id: b.device_id, identityKey: fromBase64(b.identity_key), accountKey: fromBase64(b.account_key ?? ""), sig: fromBase64(b.device_sig ?? "") })));
    return bs[0];
  }

  // ktVerify checks an answer's proof for user and the devices it lists
  // and advances the accepted checkpoint (one check at a time).
  private ktVerify(user: string, p: KTProof | undefined, devs: KTDevice[]): Promise<void> {
    const run = this.ktQueue.then(async () => {
      try {
        await this.ktVerifyLocked(user, p, devs);
      } catch (e) {
        if (e instanceof KTError) this.onKT?.({ user, error: e });
        throw e;
      }
    });
    this.ktQueue = run.catch(() => undefined);
    return run;
  }

  private async ktLoad(): Promise<{ note: NoteKey; vrf: Uint8Array } | null> {
    if (this.ktKeys !== undefined) return this.ktKeys;
    let k = await this.load<KTKeys>("kt/keys");
    if (!k) {
      try {
        k = ((await this.client.request({ type: "kt_keys" }, true)) as unknown as { kt_keys: KTKeys }).kt_keys;
      } catch (e) {
        const code = (e as { code?: string }).code;
        if (code === "not_found" || code === "unknown_type") return (this.ktKeys = null);
        throw e;
      }
      const note = parseNoteKey(k.note_key);
      if (note.name !== k.origin || fromBase64(k.vrf_key).length !== 32) throw new KTError("kt_proof", "kt_keys: malformed");
      await this.save("kt/keys", k);
    }
    this.ktKeys = { note: parseNoteKey(k.note_key), vrf: fromBase64(k.vrf_key) };
    return this.ktKeys;
  }

  private async ktVerifyLocked(user: string, p: KTProof | undefined, devs: KTDevice[]): Promise<void> {
    const keys = await this.ktLoad();
    if (!keys) return; // the server keeps no log and none was pinned
    const bad = (m: string) => new KTError("kt_proof", m);
    if (!p) throw bad(`the answer for ${user} carries no proof`);
    const c = openCheckpoint(keys.note, p.checkpoint);
    const label = verifyLabel(keys.vrf, user, fromBase64(p.vrf_proof ?? ""));
    if (!equalBytes(fromBase64(p.label ?? ""), label)) throw bad(`label of ${user} is not its VRF output`);
    const vb = await this.store.load("kt/version/" + user);
    const seen = vb ? Number(fromUtf8(vb)) : 0;
    let version = 0;
    if (!p.entry) {
      if (devs.length) throw bad(`${devs.length} devices of ${user} without a logged entry`);
      if (seen > 0) throw bad(`no entry for ${user}, whose version ${seen} was shown before`);
    } else {
      const raw = fromBase64(p.entry);
      verifyInclusion(c, p.index ?? 0, raw, (p.proof ?? []).map(fromBase64));
      const e = parseEntry(raw);
      if (!equalBytes(e.label, label)) throw bad(`the entry given for ${user} is another label's`);
      if (e.version < seen) throw bad(`entry of ${user} at version ${e.version}, version ${seen} was shown before`);
      for (const d of devs) {
        const ed = e.devices.find((x) => x.id === d.id);
        if (!ed) throw bad(`device ${user}/${d.id} is not in the logged entry`);
        if (!equalBytes(ed.identityKey, d.identityKey)) throw bad(`device ${user}/${d.id}: identity key differs from the logged one`);
        if (!equalBytes(ed.sig, d.sig)) throw bad(`device ${user}/${d.id}: certificate differs from the logged one`);
        if (!equalBytes(e.account, d.accountKey)) throw bad(`device ${user}/${d.id}: account key differs from the logged one`);
      }
      version = e.version;
    }
    await this.ktAdvance(keys.note, c, p.checkpoint);
    if (version > seen) await this.store.batch([{ key: "kt/version/" + user, value: utf8(String(version)) }]);
  }

  // ktAdvance accepts checkpoint c if the server proves it consistent
  // with the one accepted before (a newer one extends it, an older one
  // is a prefix of it).
  private async ktAdvance(note: NoteKey, c: Checkpoint, text: string): Promise<void> {
    const hb = await this.store.load("kt/head");
    const head = hb ? openCheckpoint(note, fromUtf8(hb)) : undefined;
    if (head && head.size === c.size && equalBytes(head.root, c.root)) return;
    if (head) {
      const [a, b] = c.size > head.size ? [head, c] : [c, head];
      let proof: Uint8Array[] = [];
      if (a.size > 0 && a.size < b.size) {
        const r = (await this.client.request({ type: "kt_consistency", from: a.size, to: b.size }, true)) as unknown as { kt: KTProof };
        proof = (r.kt.proof ?? []).map(fromBase64);
      }
      verifyConsistency(a, b, proof);
      if (c.size <= head.size) return;
    }
    await this.store.batch([{ key: "kt/head", value: utf8(text) }]);
  }

  // ensureSession makes sure there is a session with a whose identity is
  // the one certified for a, from a fresh certified bundle otherwise.
  private async ensureSession(a: Address): Promise<void> {
    const id = await this.device.sessionIdentity(a);
    if (id && (await this.device.certified(a, id))) return;
    const b = await this.fetchBundle(a);
    const bundle: Bundle = {
      ...a,
      registrationId: b.registration_id,
      identityKey: decodeKey(fromBase64(b.identity_key)),
      signedPreKey: { id: b.signed_prekey.id, key: decodeKey(fromBase64(b.signed_prekey.key)), sig: fromBase64(b.signed_prekey.sig ?? "") },
      preKey: b.prekey ? { id: b.prekey.id, key: decodeKey(fromBase64(b.prekey.key)) } : undefined,
      kemPreKey: b.kem_prekey ? { id: b.kem_prekey.id, key: fromBase64(b.kem_prekey.key), sig: fromBase64(b.kem_prekey.sig ?? "") } : undefined,
    };
    const cert = { ...a, identityKey: bundle.identityKey, accountKey: b.account_key ? fromBase64(b.account_key) : new Uint8Array(), sig: b.device_sig ? fromBase64(b.device_sig) : new Uint8Array() };
    try {
      await this.device.acceptDevice(cert);
    } catch (e) {
      if ((e as E2EEError).code !== "bad_certificate") throw e;
      await this.devices(a.user, true);
      await this.device.acceptDevice(cert);
    }
    await this.device.processBundle(bundle);
  }

  private async targets(users: string[], refresh: boolean): Promise<Address[]> {
    const out: Address[] = [];
    for (const u of [...new Set(users)]) {
      const ids = await this.devices(u, refresh);
      await this.device.maySend(u);
      for (const d of ids) if (u !== this.self.user || d !== this.self.device) out.push({ user: u, device: d });
    }
    return out;
  }

  private async seal(to: Address[], c: Content): Promise<EnvelopeTo[]> {
    const plain = utf8(JSON.stringify(c));
    const out: EnvelopeTo[] = [];
    for (const a of to) {
      await this.ensureSession(a);
      const r = await this.device.encrypt(a, plain);
      out.push({ ...a, type: r.type, body: r.body });
    }
    return out;
  }

  // bind fills c's labels and takes the conversation's next counter,
  // stored before it is used (a failed send leaves a gap, never a reuse).
  private async bind(conv: string, kind: string, target: number, c: Content): Promise<Content> {
    return this.serial(async () => {
      const key = "ctr/" + conv;
      const b = await this.store.load(key);
      const n = (b ? Number(fromUtf8(b)) : 0) + 1;
      await this.store.batch([{ key, value: utf8(String(n)) }]);
      const out: Content = { ...c, conv, kind, from: this.self.user, dev: this.self.device, ctr: n };
      if (target) out.target = target;
      return out;
    });
  }

  private serial<T>(f: () => Promise<T>): Promise<T> {
    const p = this.queue.then(f);
    this.queue = p.catch(() => undefined);
    return p;
  }

  // sendOwn stores the frame, keeping its content under its
  // client_msg_id first (the echo of this device's own message may come
  // before the ack, and a sender cannot decrypt its own ciphertext).
  private async sendOwn(f: Record<string, unknown>, c: Content): Promise<Ack> {
    const cmid = (f.client_msg_id as string) ?? newCmid();
    f.client_msg_id = cmid;
    const conv = f.conv_id as string;
    const key = "sent/" + ownKey(conv, cmid);
    await this.save(key, { content: c });
    const r = (await this.client.request(f, true, Number.MAX_SAFE_INTEGER)) as unknown as Ack;
    await this.save(key, { content: c, seq: r.seq });
    if (c.kind === "recall") {
      await this.recallKept(conv, c.target!, c.from!);
      return r;
    }
    await this.save(keptKey(conv, r.seq), { from: c.from, dev: c.dev, kind: c.kind, target: c.target, text: c.text } as Kept);
    if (c.kind === "edit") await this.editKept(conv, c.target!, c.from!, c.text ?? "");
    return r;
  }

  private async editKept(conv: string, target: number, author: string, text: string) {
    const k = (await this.load<Kept>(keptKey(conv, target))) ?? { from: author, kind: "text" };
    if (k.recalled) return;
    k.text = text;
    await this.save(keptKey(conv, target), k);
  }

  private async recallKept(conv: string, target: number, author: string) {
    const k = (await this.load<Kept>(keptKey(conv, target))) ?? { from: author, kind: "text" };
    delete k.text;
    k.recalled = true;
    await this.save(keptKey(conv, target), k);
  }

  // sendDirect encrypts text to every device of peer and to this user's
  // other devices (device lists read fresh) and stores it in convId.
  sendDirect(convId: string, peer: string, text: string): Promise<Ack> {
    return this.direct({ type: "send", conv_id: convId, kind: "text" }, peer, { t: "text", text });
  }
  editDirect(convId: string, target: number, peer: string, text: string): Promise<Ack> {
    return this.direct({ type: "edit", conv_id: convId, target_seq: target }, peer, { t: "text", text });
  }
  recallDirect(convId: string, target: number, peer: string): Promise<Ack> {
    return this.direct({ type: "recall", conv_id: convId, target_seq: target }, peer, { t: "recall" });
  }

  private async direct(f: Record<string, unknown>, peer: string, c: Content): Promise<Ack> {
    const to = await this.targets([peer, this.self.user], true);
    if (to.length === 0) throw new Error(`e2eechat: ${peer} has no device with keys`);
    const bound = await this.bind(f.conv_id as string, frameKind(f), (f.target_seq as number) ?? 0, c);
    f.body = encodeEnvelope({ to: await this.seal(to, bound) });
    return this.sendOwn(f, bound);
  }

  // distribute sends this device's sender key to the member devices that
  // do not have it yet, over pairwise sessions, in envelopes stored in
  // the group (so they come before the messages that need them).
  private async distribute(conv: string, members: string[], refresh: boolean): Promise<void> {
    const skdm = await this.device.groupDistribution(conv);
    const chain = parseDistribution(skdm, "modern").chainId;
    const have = new Map<string, string>();
    const b = await this.store.load(distKey(conv, chain));
    if (b) for (const line of fromUtf8(b).split("\n")) {
      const [a, id] = line.split(" ");
      have.set(a, id);
    }
    const missing: { a: Address; id: string }[] = [];
    for (const a of await this.targets(members, refresh)) {
      await this.ensureSession(a);
      const id = await this.device.sessionIdentity(a);
      if (!id) throw fail("no_session", "no session with this device: " + addr(a));
      const hexId = toHex(serializeKey(id));
      if (have.get(addr(a)) !== hexId) missing.push({ a, id: hexId });
    }
    while (missing.length) {
      const batch: EnvelopeTo[] = [];
      let size = 0;
      while (missing.length && size < ENVELOPE_BUDGET && batch.length < MAX_ENVELOPE_TO) {
        const m = missing.shift()!;
        const c = await this.bind(conv, "text", 0, { t: "skdm", skdm: toBase64(skdm) });
        const env = await this.seal([m.a], c);
        batch.push(...env);
        size += (env[0].body.length * 4) / 3 + 64;
        have.set(addr(m.a), m.id);
      }
      const cmid = newCmid();
      await this.store.batch([{ key: "ownctl/" + ownKey(conv, cmid), value: Uint8Array.of(1) }]);
      await this.client.request({ type: "send", conv_id: conv, client_msg_id: cmid, kind: "text", body: encodeEnvelope({ to: batch }) }, true, Number.MAX_SAFE_INTEGER);
      const lines = [...have].map(([a, id]) => a + " " + id).sort();
      await this.store.batch([{ key: distKey(conv, chain), value: utf8(lines.join("\n")) }]);
    }
  }

  // sendGroup sends text to group convId with members (this user included
  // for its other devices): one Sender Key ciphertext for everyone.
  sendGroup(convId: string, members: string[], text: string): Promise<Ack> {
    return this.group({ type: "send", conv_id: convId, kind: "text" }, members, { t: "text", text });
  }
  editGroup(convId: string, target: number, members: string[], text: string): Promise<Ack> {
    return this.group({ type: "edit", conv_id: convId, target_seq: target }, members, { t: "text", text });
  }
  recallGroup(convId: string, target: number, members: string[]): Promise<Ack> {
    return this.group({ type: "recall", conv_id: convId, target_seq: target }, members, { t: "recall" });
  }

  private async group(f: Record<string, unknown>, members: string[], c: Content): Promise<Ack> {
    const conv = f.conv_id as string;
    await this.distribute(conv, [...members, this.self.user], false);
    const bound = await this.bind(conv, frameKind(f), (f.target_seq as number) ?? 0, c);
    const ct = await this.device.groupEncrypt(conv, utf8(JSON.stringify(bound)));
    f.body = encodeEnvelope({ to: [], group: ct });
    return this.sendOwn(f, bound);
  }

  // rotateGroup drops this device's sender key of convId: the next send
  // distributes a new one to the members of that moment. open calls it
  // when a member leaves or is removed.
  async rotateGroup(convId: string): Promise<void> {
    const keys = await this.store.list(`skdist/${convId}/`);
    if (keys.length) await this.store.batch(keys.map((key) => ({ key, value: null })));
    await this.device.rotateGroup(convId);
  }

  // send routes by the conversation (conv_info): direct or group.
  async send(convId: string, text: string): Promise<Ack> {
    const r = await this.route(convId);
    return r.peer ? this.sendDirect(convId, r.peer, text) : this.sendGroup(convId, r.members!, text);
  }

  // edit and recall route by the conversation as send does.
  async edit(convId: string, target: number, text: string): Promise<Ack> {
    const r = await this.route(convId);
    return r.peer ? this.editDirect(convId, target, r.peer, text) : this.editGroup(convId, target, r.members!, text);
  }
  async recall(convId: string, target: number): Promise<Ack> {
    const r = await this.route(convId);
    return r.peer ? this.recallDirect(convId, target, r.peer) : this.recallGroup(convId, target, r.members!);
  }

  private async route(convId: string): Promise<{ peer?: string; members?: string[] }> {
    const info = ((await this.client.request({ type: "conv_info", conv_id: convId }, true)) as SConv).conv as ConvInfo;
    if (!info.e2e) throw new Error(`e2eechat: conversation ${convId} is not end-to-end encrypted`);
    if (info.kind === "direct") {
      const peer = info.members.find((u) => u !== this.self.user);
      if (!peer) throw new Error(`e2eechat: direct conversation ${convId} has no peer`);
      return { peer };
    }
    if (info.member_count > info.members.length) throw new Error(`e2eechat: group ${convId} has ${info.member_count} members, more than conv_info lists: use sendGroup`);
    return { members: info.members };
  }

  // open decrypts a message of an E2E conversation (a push, a sync or a
  // history entry); opening it again returns the kept copy.
  open(msg: Message): Promise<Opened> {
    return this.serial(() => this.openLocked(msg));
  }

  private async openLocked(msg: Message): Promise<Opened> {
    const o: Opened = { convId: msg.conv_id, seq: msg.seq, sender: msg.sender, senderDevice: msg.sender_device, kind: msg.kind, targetSeq: msg.target_seq };
    if (msg.kind === "system") {
      const ev = JSON.parse(msg.body ?? "{}") as { event: string; users?: string[] };
      o.system = ev;
      if (["device_added", "device_removed", "identity_changed"].includes(ev.event)) for (const u of ev.users ?? []) this.devs.delete(u);
      if (ev.event === "member_removed" || ev.event === "member_left") await this.rotateGroup(msg.conv_id);
      return o;
    }
    const k = await this.load<Kept>(keptKey(msg.conv_id, msg.seq));
    if (msg.recalled) {
      if (!k) return o;
      checkKept(msg, k);
      return { ...o, text: k.text, recalled: k.recalled };
    }
    if (k) {
      checkKept(msg, k);
      return { ...o, text: k.text, recalled: k.recalled };
    }
    if (await this.store.load(`ctl/plain/${msg.conv_id}/${msg.seq}`)) return { ...o, control: true };
    if (msg.sender === this.self.user && msg.sender_device === this.self.device) return this.openOwn(msg, o);
    if (!msg.body && msg.kind === "recall") throw new ChatError("unauthenticated_recall", "recall not authenticated by the author");
    const sender = { user: msg.sender, device: msg.sender_device ?? "" };
    const d = await this.decrypt(msg, sender);
    const err = await this.verify(msg, d);
    if (err) {
      if (err.code === "unbound" && d.content.t === "text" && msg.kind === "text" && !msg.edited) o.text = d.content.text;
      throw err;
    }
    return this.apply(msg, d.content, o);
  }

  private async openOwn(msg: Message, o: Opened): Promise<Opened> {
    const own = ownKey(msg.conv_id, msg.client_msg_id ?? "");
    if (await this.store.load("ownctl/" + own)) return { ...o, control: true };
    const rec = await this.load<{ content: Content; seq?: number }>("sent/" + own);
    if (!rec) {
      if (msg.kind === "recall") throw new ChatError("unauthenticated_recall", "recall not authenticated by the author");
      throw new ChatError("own_unknown", "own message without a local copy");
    }
    const c = rec.content;
    const bad = (field: string, server: unknown, sealed: unknown) =>
      new ChatError("metadata_mismatch", `conv ${msg.conv_id} seq ${msg.seq}: refused: the server says ${field} ${JSON.stringify(String(server))}, the encrypted content ${JSON.stringify(String(sealed))}`, field);
    if (c.kind !== msg.kind) throw bad("kind", msg.kind, c.kind);
    if ((c.target ?? 0) !== (msg.target_seq ?? 0)) throw bad("target", msg.target_seq ?? 0, c.target ?? 0);
    if (rec.seq && rec.seq !== msg.seq) throw bad("seq", msg.seq, rec.seq);
    if (msg.kind === "recall") return o;
    await this.save(keptKey(msg.conv_id, msg.seq), { from: msg.sender, dev: msg.sender_device, kind: msg.kind, target: msg.target_seq, text: c.text } as Kept);
    return { ...o, text: c.text };
  }

  private async decrypt(msg: Message, sender: Address): Promise<{ content: Content; key: string; rec: { content: string; seq?: number }; saved: boolean }> {
    const env = parseEnvelope(msg.body ?? "");
    let ct = env.group;
    let type = -1;
    if (!ct) {
      const mine = forDevice(env, this.self.user, this.self.device);
      if (!mine) throw new ChatError("not_for_device", "no ciphertext for this device");
      ct = mine.body;
      type = mine.type;
    }
    const key = "ct/" + toHex(sha256(ct));
    let rec = await this.load<{ content: string; seq?: number }>(key);
    const saved = !!rec;
    if (!rec) {
      let plain: Uint8Array;
      if (type < 0) plain = await this.device.groupDecrypt(msg.conv_id, sender, ct);
      else {
        if (type === TYPE_PREKEY) await this.certifiedSender(sender, ct);
        plain = await this.device.decrypt(sender, type, ct);
      }
      const text = fromUtf8(plain);
      JSON.parse(text); // content is JSON
      rec = { content: text };
    }
    return { content: JSON.parse(rec.content) as Content, key, rec, saved };
  }

  // certifiedSender: the identity key of a first message must be one the
  // sender's trusted account key certifies (the list read again once).
  private async certifiedSender(sender: Address, body: Uint8Array): Promise<void> {
    const p = parsePreKeySignalMessage(body);
    if (await this.device.certified(sender, p.identityKey)) return;
    await this.devices(sender.user, true);
    if (await this.device.certified(sender, p.identityKey)) return;
    throw new ChatError("uncertified", "the sender's identity key is not certified by their account key: " + addr(sender));
  }

  private async verify(msg: Message, d: { content: Content; key: string; rec: { content: string; seq?: number }; saved: boolean }): Promise<ChatError | undefined> {
    const err = await this.check(msg, d.content, d.rec.seq ?? 0);
    let saved = d.saved;
    if (!err && !d.rec.seq && !rewritten(msg, d.content)) {
      d.rec.seq = msg.seq;
      saved = false;
    }
    if (!saved) await this.save(d.key, d.rec);
    return err;
  }

  private async check(msg: Message, c: Content, first: number): Promise<ChatError | undefined> {
    if (!c.ctr || !c.kind) return new ChatError("unbound", "metadata not bound inside the encryption");
    const bad = (field: string, server: unknown, sealed: unknown) =>
      new ChatError("metadata_mismatch", `conv ${msg.conv_id} seq ${msg.seq}: refused: the server says ${field} ${JSON.stringify(String(server))}, the encrypted content ${JSON.stringify(String(sealed))}`, field);
    const target = c.target ?? 0;
    const rw = rewritten(msg, c);
    if (c.conv !== msg.conv_id) return bad("conv", msg.conv_id, c.conv);
    if (c.from !== msg.sender) return bad("from", msg.sender, c.from);
    if (!rw) {
      if (c.dev !== msg.sender_device) return bad("dev", msg.sender_device, c.dev);
      if (c.kind !== msg.kind) return bad("kind", msg.kind, c.kind);
      if (target !== (msg.target_seq ?? 0)) return bad("target", msg.target_seq ?? 0, target);
      if (first && first !== msg.seq) return bad("seq", msg.seq, first);
    }
    const ok =
      (c.t === "text" && ["text", "state", "edit"].includes(c.kind) && (c.kind === "edit") === (target !== 0)) ||
      (c.t === "skdm" && c.kind === "text" && target === 0) ||
      (c.t === "recall" && c.kind === "recall" && target !== 0);
    if (!ok) return new ChatError("metadata_mismatch", `content ${JSON.stringify(c.t)} sealed as kind ${JSON.stringify(c.kind)}, target ${target}`, "kind");
    if (target) {
      const k = await this.load<Kept>(keptKey(msg.conv_id, target));
      if (k?.from && k.from !== c.from) return bad("author", k.from, c.from);
    }
    return undefined;
  }

  private async apply(msg: Message, c: Content, o: Opened): Promise<Opened> {
    if (c.t === "skdm") {
      await this.device.processGroupDistribution(msg.conv_id, { user: msg.sender, device: msg.sender_device ?? "" }, fromBase64(c.skdm ?? ""));
      await this.store.batch([{ key: `ctl/plain/${msg.conv_id}/${msg.seq}`, value: Uint8Array.of(1) }]);
      return { ...o, control: true };
    }
    if (c.t === "recall") {
      await this.recallKept(msg.conv_id, c.target!, c.from!);
      return o;
    }
    if (rewritten(msg, c)) {
      await this.save(keptKey(msg.conv_id, msg.seq), { from: c.from, kind: "text", text: c.text } as Kept);
      return { ...o, text: c.text };
    }
    await this.save(keptKey(msg.conv_id, msg.seq), { from: c.from, dev: c.dev, kind: c.kind, target: c.target, text: c.text } as Kept);
    if (c.kind === "edit") await this.editKept(msg.conv_id, c.target!, c.from!, c.text ?? "");
    return { ...o, text: c.text };
  }

  // search looks through the messages this device decrypted or sent
  // (case-insensitive substring).
  async search(query: string): Promise<Hit[]> {
    const q = query.toLowerCase();
    const out: Hit[] = [];
    for (const key of await this.store.list("kept/")) {
      const k = await this.load<Kept>(key);
      if (!k?.text || !k.text.toLowerCase().includes(q)) continue;
      const [, conv, seq] = key.split("/");
      out.push({ convId: conv, seq: Number(seq), text: k.text });
    }
    return out.sort((a, b) => (a.convId === b.convId ? a.seq - b.seq : a.convId < b.convId ? -1 : 1));
  }

  // safetyNumber of this user and user: over the two account keys.
  async safetyNumber(user: string): Promise<string> {
    const own = await this.device.accountKey();
    if (!own) throw fail("no_account", "this device has no account key");
    let peer = (await this.device.peerAccount(user))?.key;
    if (!peer) {
      await this.devices(user, true);
      peer = (await this.device.peerAccount(user))?.key;
    }
    if (!peer) throw new Error(`e2eechat: no account key seen for ${user} yet`);
    return safetyNumber(this.self.user, own, user, peer);
  }
}

function equalBytes(a: Uint8Array, b: Uint8Array): boolean {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}

function frameKind(f: Record<string, unknown>): string {
  if (f.type === "edit") return "edit";
  if (f.type === "recall") return "recall";
  return (f.kind as string) || "text";
}

function rewritten(msg: Message, c: Content): boolean {
  return !!msg.edited && msg.kind === "text" && c.kind === "edit" && c.target === msg.seq;
}

function checkKept(msg: Message, k: Kept): void {
  const bad = (field: string, server: unknown, sealed: unknown) =>
    new ChatError("metadata_mismatch", `conv ${msg.conv_id} seq ${msg.seq}: refused: the server says ${field} ${JSON.stringify(String(server))}, the encrypted content ${JSON.stringify(String(sealed))}`, field);
  if (k.from && k.from !== msg.sender) throw bad("from", msg.sender, k.from);
  if (k.dev && k.dev !== msg.sender_device) throw bad("dev", msg.sender_device, k.dev);
  if (k.kind && k.kind !== msg.kind) throw bad("kind", msg.kind, k.kind);
  if (k.kind && (k.target ?? 0) !== (msg.target_seq ?? 0)) throw bad("target", msg.target_seq ?? 0, k.target ?? 0);
}
