// Device is one device's end-to-end state, the TypeScript twin of
// client/e2ee.Device: its identity key, its prekeys, a session per peer
// device, the sender keys of its groups, the account key and the trust it
// keeps for peers. Every operation is serialised on the device and ends
// with one atomic Store.batch of what it changed; a failed decryption
// writes nothing.

import { compare, concat, decodeJSON, encodeJSON, equal, fromBase64, randomBytes, toBase64, toHex, u32be, utf8 } from "./bytes.js";
import {
  decodeKey,
  deviceCertMessage,
  generateKeyPair,
  KeyPair,
  keyPairFromPrivate,
  serializeKey,
  sign,
  verify,
  verifyDeviceCert,
} from "./curve.js";
import { E2EEError, fail } from "./errors.js";
import { aesCBCDecrypt, aesCBCEncrypt, ChainKey, groupMessageKey, messageSeed, nextChain } from "./kdf.js";
import { generateKEMKeyPair, KEMKeyPair } from "./kem.js";
import {
  encodeDistribution,
  encodeSenderKeyMessage,
  MessageType,
  parseDistribution,
  parsePreKeySignalMessage,
  parseSenderKeyMessage,
  parseSignalMessage,
  PreKeySignalMessage,
  SenderKeyFormat,
  SignalMessage,
  TYPE_PREKEY,
  TYPE_SIGNAL,
  VERSION_PQXDH,
  verifySenderKeyMessage,
} from "./messages.js";
import {
  aliceSession,
  bobSession,
  BobParams,
  chainSeed,
  cloneState,
  decryptOn,
  encryptOn,
  MAX_ARCHIVED_STATES,
  PendingPreKey,
  SessionState,
  SkippedKey,
} from "./ratchet.js";
import { Store, Tx } from "./store.js";

export const MAX_SENDER_KEY_STATES = 5;

// Address names one device of one user.
export interface Address {
  user: string;
  device: string;
}
export const addr = (a: Address): string => a.user + "/" + a.device;

export interface SignedPreKey {
  id: number;
  key: Uint8Array; // 32 bytes
  sig: Uint8Array; // XEdDSA over serializeKey(key)
}
export interface KEMPreKey {
  id: number;
  key: Uint8Array; // KEM_TYPE || encapsulation key
  sig: Uint8Array; // XEdDSA over key
}
export interface KeyUpload {
  registrationId: number;
  identityKey: Uint8Array;
  signedPreKey?: SignedPreKey;
  preKeys: { id: number; key: Uint8Array }[];
  kemPreKeys: KEMPreKey[];
  lastResortKEM?: KEMPreKey;
}
export interface Bundle extends Address {
  registrationId: number;
  identityKey: Uint8Array;
  signedPreKey: SignedPreKey;
  preKey?: { id: number; key: Uint8Array };
  kemPreKey?: KEMPreKey; // absent: classic X3DH
}

export function verifyBundle(b: Bundle): void {
  if (!verify(b.identityKey, serializeKey(b.signedPreKey.key), b.signedPreKey.sig)) {
    throw fail("bad_signature", "bad signature: signed prekey signature does not verify");
  }
  if (b.kemPreKey && !verify(b.identityKey, b.kemPreKey.key, b.kemPreKey.sig)) {
    throw fail("bad_signature", "bad signature: KEM prekey signature does not verify");
  }
}

export type TrustPolicy = "tofu" | "strict";

// DeviceCert is a device as the key directory lists it.
export interface DeviceCert extends Address {
  identityKey: Uint8Array; // 32 bytes
  accountKey: Uint8Array; // serialized, 33 bytes; empty without one
  sig: Uint8Array;
}
export const certValid = (c: DeviceCert): boolean =>
  verifyDeviceCert(c.accountKey, c.user, c.device, serializeKey(c.identityKey), c.sig);

export interface AccountChange {
  user: string;
  old: Uint8Array;
  new: Uint8Array;
  wasVerified: boolean;
  accepted: boolean;
}
export interface DeviceCheck {
  accepted: DeviceCert[];
  refused: DeviceCert[];
  change?: AccountChange;
}

interface Identity {
  key: KeyPair;
  reg: number;
}
interface Meta {
  nextPreKey: number;
  nextSigned: number;
  nextKEM: number;
  signed: number;
  lastResort: number;
  hasSigned: boolean;
  hasLastResort: boolean;
  signedAt: number;
  lastResortAt: number;
  retired: { signed: boolean; id: number; at: number }[];
}
interface SessionRecord {
  current?: SessionState;
  previous: SessionState[]; // newest first
}
interface PeerAccount {
  key: Uint8Array;
  verified?: boolean;
  blocked?: boolean;
  pending?: Uint8Array;
}
interface SenderKeyState {
  dist: Uint8Array;
  chainId: number;
  chain: ChainKey;
  signPub: Uint8Array;
  signPriv?: Uint8Array;
  skipped: SkippedKey[];
}

const emptyMeta = (): Meta => ({
  nextPreKey: 0,
  nextSigned: 0,
  nextKEM: 0,
  signed: 0,
  lastResort: 0,
  hasSigned: false,
  hasLastResort: false,
  signedAt: 0,
  lastResortAt: 0,
  retired: [],
});

async function get<T>(tx: Tx, key: string): Promise<T | undefined> {
  const b = await tx.load(key);
  if (!b) return undefined;
  try {
    return decodeJSON<T>(b);
  } catch (e) {
    throw new Error(`e2ee: store entry ${JSON.stringify(key)}: ${(e as Error).message}`);
  }
}
const put = (tx: Tx, key: string, v: unknown) => tx.put(key, encodeJSON(v));

const ACCOUNT_HEADER = "parley-account-key-v1 ";

// marshalAccountKey is client/e2ee's export form: one line,
// "parley-account-key-v1 " then the private key in standard base64.
export const marshalAccountKey = (k: KeyPair): string => ACCOUNT_HEADER + toBase64(k.priv) + "\n";

export function parseAccountKey(s: string): KeyPair {
  const t = s.endsWith("\n") ? s.slice(0, -1) : s;
  if (!t.startsWith(ACCOUNT_HEADER)) throw fail("bad_key", "malformed key: not a parley account key");
  let raw: Uint8Array;
  try {
    raw = fromBase64(t.slice(ACCOUNT_HEADER.length));
  } catch {
    throw fail("bad_key", "malformed key: account key is not 32 bytes of base64");
  }
  if (raw.length !== 32 || toBase64(raw) !== t.slice(ACCOUNT_HEADER.length)) {
    throw fail("bad_key", "malformed key: account key is not 32 bytes of base64");
  }
  const kp = keyPairFromPrivate(raw);
  if (!equal(kp.priv, raw)) throw fail("bad_key", "malformed key: account key is not clamped");
  return kp;
}

const usedBaseKey = (spk: number, kem: number, base: Uint8Array) => `basekey/${spk}/${kem}/${toHex(serializeKey(base))}`;
const senderKeyKey = (group: string, sender: Address) => "sk/" + group + "/" + addr(sender);

export class Device {
  private lock: Promise<unknown> = Promise.resolve();
  trust: TrustPolicy = "tofu";
  allowX3DH = false;
  now: () => number = () => Date.now();

  private constructor(
    readonly store: Store,
    readonly self: Address,
    private id: Identity,
  ) {}

  // open loads the device's state from st, creating an identity key and a
  // registration id (1..16384) on first use.
  static async open(st: Store, self: Address): Promise<Device> {
    const tx = new Tx(st);
    let id = await get<Identity>(tx, "identity");
    if (!id) {
      id = { key: generateKeyPair(), reg: (u32be(randomBytes(4)) & 0x3fff) + 1 };
      put(tx, "identity", id);
      await tx.commit();
    }
    return new Device(st, self, id);
  }

  get identityKey(): Uint8Array {
    return this.id.key.pub;
  }
  get registrationId(): number {
    return this.id.reg;
  }

  // run serialises f on the device and commits its writes when it returns.
  private run<T>(f: (tx: Tx) => Promise<T>): Promise<T> {
    const p = this.lock.then(async () => {
      const tx = new Tx(this.store);
      const out = await f(tx);
      await tx.commit();
      return out;
    });
    this.lock = p.catch(() => undefined);
    return p;
  }

  // generateKeys makes n one-time Curve25519 and n one-time ML-KEM prekeys,
  // and the signed prekey and last-resort KEM key if the device has none.
  generateKeys(n: number): Promise<KeyUpload> {
    return this.run(async (tx) => {
      const m = (await get<Meta>(tx, "meta")) ?? emptyMeta();
      const up: KeyUpload = { registrationId: this.id.reg, identityKey: this.id.key.pub, preKeys: [], kemPreKeys: [] };
      if (!m.hasSigned) up.signedPreKey = this.newSigned(tx, m);
      if (!m.hasLastResort) up.lastResortKEM = this.newKEM(tx, m, true);
      for (let i = 0; i < n; i++) {
        m.nextPreKey++;
        const kp = generateKeyPair();
        put(tx, "prekey/" + m.nextPreKey, { key: kp });
        up.preKeys.push({ id: m.nextPreKey, key: kp.pub });
        up.kemPreKeys.push(this.newKEM(tx, m, false));
      }
      put(tx, "meta", m);
      return up;
    });
  }

  private newSigned(tx: Tx, m: Meta): SignedPreKey {
    m.nextSigned++;
    const kp = generateKeyPair();
    const sig = sign(this.id.key.priv, serializeKey(kp.pub));
    put(tx, "signed/" + m.nextSigned, { key: kp, sig });
    m.signed = m.nextSigned;
    m.hasSigned = true;
    m.signedAt = this.now();
    return { id: m.nextSigned, key: kp.pub, sig };
  }

  private newKEM(tx: Tx, m: Meta, lastResort: boolean): KEMPreKey {
    m.nextKEM++;
    const kp = generateKEMKeyPair();
    const sig = sign(this.id.key.priv, kp.pub);
    put(tx, "kem/" + m.nextKEM, { key: kp, sig, lastResort });
    if (lastResort) {
      m.lastResort = m.nextKEM;
      m.hasLastResort = true;
      m.lastResortAt = this.now();
    }
    return { id: m.nextKEM, key: kp.pub, sig };
  }

  // rotateSignedPreKey makes a new signed prekey (to upload); the one it
  // replaces is kept until pruneRetiredKeys drops it.
  rotateSignedPreKey(): Promise<SignedPreKey> {
    return this.run(async (tx) => {
      const m = (await get<Meta>(tx, "meta")) ?? emptyMeta();
      const [old, had, at] = [m.signed, m.hasSigned, m.signedAt];
      const spk = this.newSigned(tx, m);
      if (had) m.retired.push({ signed: true, id: old, at: m.signedAt || at });
      put(tx, "meta", m);
      return spk;
    });
  }

  rotateLastResortKEM(): Promise<KEMPreKey> {
    return this.run(async (tx) => {
      const m = (await get<Meta>(tx, "meta")) ?? emptyMeta();
      const [old, had] = [m.lastResort, m.hasLastResort];
      const k = this.newKEM(tx, m, true);
      if (had) m.retired.push({ signed: false, id: old, at: m.lastResortAt });
      put(tx, "meta", m);
      return k;
    });
  }

  // rotationDue: whether the signed prekey and the last-resort KEM key are
  // older than maxAgeMs.
  rotationDue(maxAgeMs: number): Promise<{ signed: boolean; lastResort: boolean }> {
    return this.run(async (tx) => {
      const m = (await get<Meta>(tx, "meta")) ?? emptyMeta();
      const due = (has: boolean, at: number) => has && (at === 0 || this.now() - at >= maxAgeMs);
      return { signed: due(m.hasSigned, m.signedAt), lastResort: due(m.hasLastResort, m.lastResortAt) };
    });
  }

  // pruneRetiredKeys deletes the keys replaced more than graceMs ago and
  // the base keys remembered for them.
  pruneRetiredKeys(graceMs: number): Promise<void> {
    return this.run(async (tx) => {
      const m = (await get<Meta>(tx, "meta")) ?? emptyMeta();
      const cutoff = this.now() - graceMs;
      const kept = m.retired.filter((r) => r.at > cutoff);
      if (kept.length === m.retired.length) return;
      for (const r of m.retired) {
        if (r.at > cutoff) continue;
        if (r.signed) {
          tx.del("signed/" + r.id);
          for (const k of await tx.list(`basekey/${r.id}/`)) tx.del(k);
        } else {
          tx.del("kem/" + r.id);
          for (const k of await tx.list("basekey/")) if (k.split("/")[2] === String(r.id)) tx.del(k);
        }
      }
      m.retired = kept;
      put(tx, "meta", m);
    });
  }

  // publicKeys: the identity, current signed prekey and last-resort KEM key.
  publicKeys(): Promise<KeyUpload> {
    return this.run(async (tx) => {
      const m = (await get<Meta>(tx, "meta")) ?? emptyMeta();
      const up: KeyUpload = { registrationId: this.id.reg, identityKey: this.id.key.pub, preKeys: [], kemPreKeys: [] };
      if (m.hasSigned) {
        const s = await get<{ key: KeyPair; sig: Uint8Array }>(tx, "signed/" + m.signed);
        if (!s) throw new Error(`e2ee: signed prekey ${m.signed}: missing`);
        up.signedPreKey = { id: m.signed, key: s.key.pub, sig: s.sig };
      }
      if (m.hasLastResort) {
        const k = await get<{ key: KEMKeyPair; sig: Uint8Array }>(tx, "kem/" + m.lastResort);
        if (!k) throw new Error(`e2ee: last-resort KEM prekey ${m.lastResort}: missing`);
        up.lastResortKEM = { id: m.lastResort, key: k.key.pub, sig: k.sig };
      }
      return up;
    });
  }

  private async checkTrust(tx: Tx, peer: Address, key: Uint8Array): Promise<boolean> {
    const known = await get<Uint8Array>(tx, "trust/" + addr(peer));
    if (known && equal(known, key)) return false;
    if (known && this.trust === "strict") throw fail("untrusted", "identity key changed: " + addr(peer));
    put(tx, "trust/" + addr(peer), key);
    return !!known;
  }

  trustIdentity(peer: Address, key: Uint8Array): Promise<void> {
    return this.run(async (tx) => put(tx, "trust/" + addr(peer), key));
  }

  peerIdentity(peer: Address): Promise<Uint8Array | undefined> {
    return this.run((tx) => get<Uint8Array>(tx, "trust/" + addr(peer)));
  }

  // processBundle starts a session with the bundle's device (PQXDH; a
  // bundle without a KEM prekey is a downgrade unless allowX3DH).
  processBundle(b: Bundle): Promise<void> {
    try {
      verifyBundle(b);
    } catch (e) {
      return Promise.reject(e);
    }
    return this.run(async (tx) => {
      if (!b.kemPreKey && !this.allowX3DH) throw fail("downgrade", `downgrade to classic X3DH refused: the bundle of ${addr(b)} has no KEM prekey`);
      await this.checkTrust(tx, b, b.identityKey);
      const base = generateKeyPair();
      const pend: PendingPreKey = { signedPreKeyId: b.signedPreKey.id, baseKey: base.pub };
      if (b.preKey) pend.preKeyId = b.preKey.id;
      if (b.kemPreKey) pend.kyberPreKeyId = b.kemPreKey.id;
      let r;
      try {
        r = aliceSession({
          identity: this.id.key,
          base,
          theirIdentity: b.identityKey,
          theirSignedPreKey: b.signedPreKey.key,
          theirRatchet: b.signedPreKey.key,
          theirOneTime: b.preKey?.key,
          theirKEM: b.kemPreKey?.key,
        });
      } catch (e) {
        throw fail("bad_bundle", "bad prekey bundle: " + (e as Error).message);
      }
      if (r.kct) pend.kyberCiphertext = r.kct;
      r.state.pending = pend;
      r.state.localRegId = this.id.reg;
      r.state.remoteRegId = b.registrationId;
      const key = "session/" + addr(b);
      const rec = (await get<SessionRecord>(tx, key)) ?? { previous: [] };
      promote(rec, r.state);
      put(tx, key, rec);
    });
  }

  hasSession(peer: Address): Promise<boolean> {
    return this.run(async (tx) => !!(await get<SessionRecord>(tx, "session/" + addr(peer)))?.current);
  }

  // sessionIdentity: the identity key of peer's current session.
  sessionIdentity(peer: Address): Promise<Uint8Array | undefined> {
    return this.run(async (tx) => (await get<SessionRecord>(tx, "session/" + addr(peer)))?.current?.remoteIdentity);
  }

  // encrypt seals plain for peer on the current session.
  encrypt(peer: Address, plain: Uint8Array): Promise<{ type: MessageType; body: Uint8Array }> {
    return this.run(async (tx) => {
      const key = "session/" + addr(peer);
      const rec = await get<SessionRecord>(tx, key);
      if (!rec?.current) throw fail("no_session", "no session with this device: " + addr(peer));
      const out = await encryptOn(rec.current, plain);
      put(tx, key, rec);
      return out;
    });
  }

  // decrypt opens a pairwise message from peer; a failure stores nothing.
  decrypt(peer: Address, type: number, body: Uint8Array): Promise<Uint8Array> {
    if (type === TYPE_SIGNAL) {
      let m: SignalMessage;
      try {
        m = parseSignalMessage(body);
      } catch (e) {
        return Promise.reject(e);
      }
      return this.run(async (tx) => {
        const key = "session/" + addr(peer);
        const rec = await get<SessionRecord>(tx, key);
        if (!rec) throw fail("no_session", "no session with this device: " + addr(peer));
        const plain = await decryptRecord(rec, m);
        put(tx, key, rec);
        return plain;
      });
    }
    if (type === TYPE_PREKEY) {
      let p: PreKeySignalMessage;
      try {
        p = parsePreKeySignalMessage(body);
      } catch (e) {
        return Promise.reject(e);
      }
      return this.run((tx) => this.decryptPreKey(tx, peer, p));
    }
    return Promise.reject(fail("malformed", "malformed message: message type " + type));
  }

  private async decryptPreKey(tx: Tx, peer: Address, p: PreKeySignalMessage): Promise<Uint8Array> {
    const key = "session/" + addr(peer);
    const rec = (await get<SessionRecord>(tx, key)) ?? { previous: [] };
    const same = (s?: SessionState) => !!s && equal(s.baseKey, p.baseKey) && s.version === p.version;
    if (same(rec.current) || rec.previous.some(same)) {
      const plain = await decryptRecord(rec, p.message);
      put(tx, key, rec);
      return plain;
    }
    if (p.version < VERSION_PQXDH && !this.allowX3DH) {
      throw fail("downgrade", `downgrade to classic X3DH refused: version ${p.version} first message from ${addr(peer)}`);
    }
    const spk = await get<{ key: KeyPair }>(tx, "signed/" + p.signedPreKeyId);
    if (!spk) throw fail("invalid_prekey", "unknown prekey id: signed prekey " + p.signedPreKeyId);
    const bp: BobParams = {
      identity: this.id.key,
      signedPreKey: spk.key,
      ratchet: spk.key,
      theirIdentity: p.identityKey,
      theirBaseKey: p.baseKey,
    };
    if (p.preKeyId !== undefined) {
      const otk = await get<{ key: KeyPair }>(tx, "prekey/" + p.preKeyId);
      if (!otk) throw fail("invalid_prekey", `unknown prekey id: one-time prekey ${p.preKeyId} (used or unknown)`);
      bp.oneTime = otk.key;
    }
    let kem: { key: KEMKeyPair; lastResort: boolean } | undefined;
    if (p.version >= VERSION_PQXDH) {
      kem = await get(tx, "kem/" + p.kyberPreKeyId);
      if (!kem) throw fail("invalid_prekey", `unknown prekey id: KEM prekey ${p.kyberPreKeyId} (used or unknown)`);
      bp.kem = kem.key;
      bp.kemCiphertext = p.kyberCiphertext;
    }
    let used = "";
    if (p.preKeyId === undefined && (p.version < VERSION_PQXDH || kem?.lastResort)) {
      used = usedBaseKey(p.signedPreKeyId, p.version >= VERSION_PQXDH ? (p.kyberPreKeyId ?? 0) : 0, p.baseKey);
      if (await tx.load(used)) throw fail("reused_base_key", `reused base key (replayed first message): from ${addr(peer)} on signed prekey ${p.signedPreKeyId}`);
    }
    const st = bobSession(bp);
    st.localRegId = this.id.reg;
    st.remoteRegId = p.registrationId;
    const plain = await decryptOn(st, p.message);
    await this.checkTrust(tx, peer, p.identityKey);
    if (used) tx.put(used, Uint8Array.of(1));
    promote(rec, st);
    put(tx, key, rec);
    if (p.preKeyId !== undefined) tx.del("prekey/" + p.preKeyId);
    if (p.version >= VERSION_PQXDH && !kem?.lastResort) tx.del("kem/" + p.kyberPreKeyId);
    return plain;
  }

  // reset forgets the session with peer.
  reset(peer: Address): Promise<void> {
    return this.run(async (tx) => tx.del("session/" + addr(peer)));
  }

  // --- Account key and device certificates (client/e2ee account.go) ---

  accountKey(): Promise<Uint8Array | undefined> {
    return this.run(async (tx) => (await get<{ key: KeyPair }>(tx, "account"))?.key.pub);
  }

  createAccountKey(): Promise<Uint8Array> {
    const kp = generateKeyPair();
    return this.run(async (tx) => {
      put(tx, "account", { key: kp });
      return kp.pub;
    });
  }

  exportAccountKey(): Promise<string> {
    return this.run(async (tx) => {
      const a = await get<{ key: KeyPair }>(tx, "account");
      if (!a) throw fail("no_account", "this device has no account key");
      return marshalAccountKey(a.key);
    });
  }

  importAccountKey(s: string): Promise<Uint8Array> {
    const kp = parseAccountKey(s);
    return this.run(async (tx) => {
      put(tx, "account", { key: kp });
      return kp.pub;
    });
  }

  // deviceCertificate: the account key (serialized) and its signature over
  // this device's DeviceCertMessage, what keys_upload carries as
  // account_key and device_sig.
  deviceCertificate(): Promise<{ accountKey: Uint8Array; sig: Uint8Array }> {
    return this.run(async (tx) => {
      const a = await get<{ key: KeyPair }>(tx, "account");
      if (!a) throw fail("no_account", "this device has no account key");
      const sig = sign(a.key.priv, deviceCertMessage(this.self.user, this.self.device, serializeKey(this.id.key.pub)));
      return { accountKey: serializeKey(a.key.pub), sig };
    });
  }

  private async trustedAccount(tx: Tx, user: string): Promise<Uint8Array | undefined> {
    if (user === this.self.user) return (await get<{ key: KeyPair }>(tx, "account"))?.key.pub;
    return (await get<PeerAccount>(tx, "acct/" + user))?.key;
  }

  private async recordCert(tx: Tx, c: DeviceCert, account: Uint8Array): Promise<void> {
    const key = "cert/" + addr(c);
    const cur = await get<{ id: Uint8Array; acct: Uint8Array }>(tx, key);
    if (cur && equal(cur.id, c.identityKey) && equal(cur.acct, account)) return;
    put(tx, key, { id: c.identityKey, acct: account });
    put(tx, "trust/" + addr(c), c.identityKey);
  }

  // acceptDevices applies the trust policy to a user's device list as the
  // server gave it (client/e2ee.Device.AcceptDevices).
  acceptDevices(user: string, certs: DeviceCert[]): Promise<DeviceCheck> {
    return this.run(async (tx) => {
      const out: DeviceCheck = { accepted: [], refused: [] };
      const byKey = new Map<string, { key: Uint8Array; certs: DeviceCert[] }>();
      for (const c of certs) {
        let ak: Uint8Array;
        try {
          ak = decodeKey(c.accountKey);
        } catch {
          out.refused.push(c);
          continue;
        }
        if (c.user !== user || !certValid(c)) {
          out.refused.push(c);
          continue;
        }
        const h = toHex(ak);
        if (!byKey.has(h)) byKey.set(h, { key: ak, certs: [] });
        byKey.get(h)!.certs.push(c);
      }
      const trusted = await this.trustedAccount(tx, user);
      let rec: PeerAccount | undefined = user !== this.self.user ? await get<PeerAccount>(tx, "acct/" + user) : undefined;
      let use: Uint8Array | undefined;
      if (trusted && byKey.has(toHex(trusted))) {
        use = trusted;
        if (rec?.pending) {
          delete rec.pending;
          put(tx, "acct/" + user, rec);
        }
      } else if (user === this.self.user || byKey.size !== 1) {
        // own devices: the own account key or none; several untrusted keys: no account
      } else {
        const only = [...byKey.values()][0].key;
        const wasVerified = !!(rec?.verified || rec?.blocked);
        if (!trusted) {
          rec = { key: only };
        } else if (this.trust === "strict") {
          out.change = { user, old: trusted, new: only, wasVerified, accepted: false };
          if (!rec!.pending || !equal(rec!.pending, only)) {
            rec!.pending = only;
            put(tx, "acct/" + user, rec);
          }
          const e = fail("untrusted", `the account key of ${user} changed (refused under the strict trust policy until accepted)`);
          (e as E2EEError & { check?: DeviceCheck }).check = out;
          await tx.commit();
          throw e;
        } else {
          out.change = { user, old: trusted, new: only, wasVerified, accepted: true };
          rec = { key: only, blocked: wasVerified || undefined };
        }
        use = only;
        put(tx, "acct/" + user, rec);
      }
      const keys = [...byKey.values()].sort((a, b) => compare(a.key, b.key));
      for (const k of keys) {
        if (use && equal(k.key, use)) {
          for (const c of k.certs) {
            await this.recordCert(tx, c, k.key);
            out.accepted.push(c);
          }
        } else out.refused.push(...k.certs);
      }
      return out;
    });
  }

  // acceptDevice accepts one device only if its certificate verifies with
  // the account key already trusted for its user.
  acceptDevice(c: DeviceCert): Promise<void> {
    return this.run(async (tx) => {
      const trusted = await this.trustedAccount(tx, c.user);
      if (!trusted || !equal(c.accountKey, serializeKey(trusted)) || !certValid(c)) {
        throw fail("bad_certificate", "device certificate does not verify with the user's account key: " + addr(c));
      }
      await this.recordCert(tx, c, trusted);
    });
  }

  certified(peer: Address, identity: Uint8Array): Promise<boolean> {
    return this.run(async (tx) => {
      const trusted = await this.trustedAccount(tx, peer.user);
      if (!trusted) return false;
      const c = await get<{ id: Uint8Array; acct: Uint8Array }>(tx, "cert/" + addr(peer));
      return !!c && equal(c.id, identity) && equal(c.acct, trusted);
    });
  }

  peerAccount(user: string): Promise<PeerAccount | undefined> {
    return this.run(async (tx) => {
      if (user === this.self.user) {
        const k = await this.trustedAccount(tx, user);
        return k ? { key: k, verified: true } : undefined;
      }
      return get<PeerAccount>(tx, "acct/" + user);
    });
  }

  // maySend: not while a verified user's changed key is not verified
  // again, nor while a new key waits under the strict policy.
  maySend(user: string): Promise<void> {
    if (user === this.self.user) return Promise.resolve();
    return this.run(async (tx) => {
      const rec = await get<PeerAccount>(tx, "acct/" + user);
      if (rec?.pending) throw fail("untrusted", `the account key of ${user} changed (refused under the strict trust policy until accepted)`);
      if (rec?.blocked) throw fail("verified_changed", `the account key of a verified user changed: ${user} (compare the new safety number, then verify again)`);
    });
  }

  trustAccount(user: string): Promise<void> {
    return this.run(async (tx) => {
      const rec = await get<PeerAccount>(tx, "acct/" + user);
      if (!rec?.pending) return;
      put(tx, "acct/" + user, { key: rec.pending, blocked: rec.verified || rec.blocked || undefined });
    });
  }

  verifyAccount(user: string): Promise<Uint8Array> {
    if (user === this.self.user) return Promise.reject(new Error("e2ee: cannot verify one's own account"));
    return this.run(async (tx) => {
      const rec = await get<PeerAccount>(tx, "acct/" + user);
      if (!rec) throw new Error(`e2ee: no account key seen for ${user} yet`);
      const key = rec.pending ?? rec.key;
      put(tx, "acct/" + user, { key, verified: true });
      return key;
    });
  }

  // --- Sender Keys (client/e2ee group.go) ---

  // groupDistribution returns this device's SenderKeyDistributionMessage
  // for group, creating its sender key on first use or after rotateGroup.
  groupDistribution(group: string, f: SenderKeyFormat = "modern"): Promise<Uint8Array> {
    return this.run(async (tx) => {
      const key = senderKeyKey(group, this.self);
      let rec = (await get<{ states: SenderKeyState[] }>(tx, key)) ?? { states: [] };
      if (!rec.states[0]?.signPriv) {
        const dist = randomBytes(16);
        dist[6] = (dist[6] & 0x0f) | 0x40;
        dist[8] = (dist[8] & 0x3f) | 0x80;
        const sk = generateKeyPair();
        rec = {
          states: [
            { dist, chainId: u32be(randomBytes(4)) & 0x7fffffff, chain: { key: randomBytes(32), index: 0 }, signPub: sk.pub, signPriv: sk.priv, skipped: [] },
          ],
        };
        put(tx, key, rec);
      }
      const s = rec.states[0];
      return encodeDistribution({ distributionId: s.dist, chainId: s.chainId, iteration: s.chain.index, chainKey: s.chain.key, signingKey: s.signPub }, f);
    });
  }

  // rotateGroup forgets this device's sender key for group (a member left).
  rotateGroup(group: string): Promise<void> {
    return this.run(async (tx) => tx.del(senderKeyKey(group, this.self)));
  }

  groupEncrypt(group: string, plain: Uint8Array, f: SenderKeyFormat = "modern"): Promise<Uint8Array> {
    return this.run(async (tx) => {
      const key = senderKeyKey(group, this.self);
      const rec = await get<{ states: SenderKeyState[] }>(tx, key);
      const s = rec?.states[0];
      if (!s?.signPriv) throw fail("no_sender_key", `no sender key for this group and sender: own sender key for ${JSON.stringify(group)} (send a distribution first)`);
      const mk = groupMessageKey(messageSeed(s.chain));
      const ct = await aesCBCEncrypt(mk.key, mk.iv, plain);
      const out = encodeSenderKeyMessage(f, s.dist, s.chainId, s.chain.index, ct, s.signPriv);
      s.chain = nextChain(s.chain);
      put(tx, key, rec);
      return out;
    });
  }

  processGroupDistribution(group: string, sender: Address, msg: Uint8Array, f: SenderKeyFormat = "modern"): Promise<void> {
    let d: ReturnType<typeof parseDistribution>;
    try {
      d = parseDistribution(msg, f);
    } catch (e) {
      return Promise.reject(e);
    }
    return this.run(async (tx) => {
      const key = senderKeyKey(group, sender);
      const rec = (await get<{ states: SenderKeyState[] }>(tx, key)) ?? { states: [] };
      if (rec.states.some((s) => s.chainId === d.chainId && equal(s.signPub, d.signingKey))) return;
      rec.states.unshift({ dist: d.distributionId, chainId: d.chainId, chain: { key: d.chainKey, index: d.iteration }, signPub: d.signingKey, skipped: [] });
      rec.states = rec.states.slice(0, MAX_SENDER_KEY_STATES);
      put(tx, key, rec);
    });
  }

  groupDecrypt(group: string, sender: Address, msg: Uint8Array, f: SenderKeyFormat = "modern"): Promise<Uint8Array> {
    let m: ReturnType<typeof parseSenderKeyMessage>;
    try {
      m = parseSenderKeyMessage(msg, f);
    } catch (e) {
      return Promise.reject(e);
    }
    return this.run(async (tx) => {
      const key = senderKeyKey(group, sender);
      const rec = (await get<{ states: SenderKeyState[] }>(tx, key)) ?? { states: [] };
      const s = rec.states.find((st) => st.chainId === m.chainId && (f === "legacy" || equal(st.dist, m.distributionId)));
      if (!s) throw fail("no_sender_key", `no sender key for this group and sender: ${addr(sender)} in ${JSON.stringify(group)}, chain ${m.chainId}`);
      if (!verifySenderKeyMessage(m, s.signPub)) throw fail("bad_signature", "bad signature: group message");
      const rc = { chain: s.chain, skipped: s.skipped.slice() };
      const seed = chainSeed(rc, m.iteration);
      const mk = groupMessageKey(seed);
      const plain = await aesCBCDecrypt(mk.key, mk.iv, m.ciphertext);
      s.chain = rc.chain;
      s.skipped = rc.skipped;
      put(tx, key, rec);
      return plain;
    });
  }
}

function promote(r: SessionRecord, s: SessionState): void {
  if (r.current) {
    r.previous.unshift(r.current);
    r.previous = r.previous.slice(0, MAX_ARCHIVED_STATES);
  }
  r.current = s;
}

// decryptRecord tries the current session, then the archived ones
// (promoting the one that opens the message); r changes only on success.
async function decryptRecord(r: SessionRecord, m: SignalMessage): Promise<Uint8Array> {
  let first: unknown;
  if (r.current) {
    const c = cloneState(r.current);
    try {
      const plain = await decryptOn(c, m);
      r.current = c;
      return plain;
    } catch (e) {
      first = e;
    }
  }
  for (let i = 0; i < r.previous.length; i++) {
    const c = cloneState(r.previous[i]);
    try {
      const plain = await decryptOn(c, m);
      r.previous.splice(i, 1);
      promote(r, c);
      return plain;
    } catch {
      // the next archived session
    }
  }
  throw first ?? fail("no_session", "no session with this device");
}

