// Wire formats of libsignal (rust/protocol/src/proto/wire.proto), byte for
// byte those of client/e2ee: a version byte (high nibble: the message
// version, low nibble: the newest version the sender knows), the protobuf,
// then an 8-byte truncated HMAC-SHA256 (SignalMessage) or a 64-byte XEdDSA
// signature (SenderKeyMessage).

import { concat, equal } from "./bytes.js";
import { decodeKey, serializeKey, sign, verify } from "./curve.js";
import { E2EEError, fail } from "./errors.js";
import { hmacSHA256 } from "./kdf.js";
import { PbWriter, pbBytes, pbParse, pbUint32 } from "./proto.js";

export const VERSION_X3DH = 3;
export const VERSION_PQXDH = 4;
export const SENDER_KEY_VERSION = 3;
const MAC_LEN = 8;
const SIG_LEN = 64;

// libsignal's CiphertextMessageType values.
export const TYPE_SIGNAL = 2;
export const TYPE_PREKEY = 3;
export const TYPE_SENDER_KEY = 7;
export type MessageType = 2 | 3;

const malformed = (what: string) => fail("malformed", "malformed message: " + what);

function parse(b: Uint8Array, what: string) {
  try {
    return pbParse(b);
  } catch {
    throw malformed(what + " protobuf");
  }
}

function fields<T>(what: string, f: () => T): T {
  try {
    return f();
  } catch (e) {
    if (e instanceof E2EEError) throw e;
    throw malformed(what + " fields");
  }
}

export interface SignalMessage {
  version: number;
  ratchetKey: Uint8Array; // 32 bytes
  counter: number;
  previousCounter: number;
  ciphertext: Uint8Array;
  serialized: Uint8Array;
}

function signalMAC(macKey: Uint8Array, sender: Uint8Array, receiver: Uint8Array, msg: Uint8Array): Uint8Array {
  return hmacSHA256(macKey, serializeKey(sender), serializeKey(receiver), msg).slice(0, MAC_LEN);
}

export function newSignalMessage(
  version: number,
  macKey: Uint8Array,
  ratchet: Uint8Array,
  counter: number,
  prev: number,
  ct: Uint8Array,
  sender: Uint8Array,
  receiver: Uint8Array,
): SignalMessage {
  const body = new PbWriter()
    .raw([(version << 4) | version])
    .bytes(1, serializeKey(ratchet))
    .uint32(2, counter)
    .uint32(3, prev)
    .bytes(4, ct)
    .finish();
  const mac = signalMAC(macKey, sender, receiver, body);
  return { version, ratchetKey: ratchet, counter, previousCounter: prev, ciphertext: ct, serialized: concat(body, mac) };
}

export function verifyMAC(m: SignalMessage, macKey: Uint8Array, sender: Uint8Array, receiver: Uint8Array): boolean {
  const n = m.serialized.length - MAC_LEN;
  return equal(signalMAC(macKey, sender, receiver, m.serialized.subarray(0, n)), m.serialized.subarray(n));
}

function checkVersion(b: number): number {
  const v = b >> 4;
  if (v < VERSION_X3DH || v > VERSION_PQXDH) throw fail("version", "unsupported message version: " + v);
  return v;
}

export function parseSignalMessage(b: Uint8Array): SignalMessage {
  if (b.length < 1 + MAC_LEN) throw malformed("SignalMessage of " + b.length + " bytes");
  const v = checkVersion(b[0]);
  const f = parse(b.subarray(1, b.length - MAC_LEN), "SignalMessage");
  const [rk, ctr, prev, ct] = fields("SignalMessage", () => [pbBytes(f, 1), pbUint32(f, 2), pbUint32(f, 3), pbBytes(f, 4)] as const);
  if (!rk || ctr === undefined || !ct) throw malformed("SignalMessage fields");
  return { version: v, ratchetKey: decodeKey(rk), counter: ctr, previousCounter: prev ?? 0, ciphertext: ct, serialized: b.slice() };
}

export interface PreKeySignalMessage {
  version: number;
  registrationId: number;
  preKeyId?: number; // set when a one-time prekey was used
  signedPreKeyId: number;
  kyberPreKeyId?: number; // version 4
  kyberCiphertext?: Uint8Array; // version 4: KEM_TYPE || ciphertext
  baseKey: Uint8Array;
  identityKey: Uint8Array;
  message: SignalMessage;
  serialized: Uint8Array;
}

export function encodePreKey(p: Omit<PreKeySignalMessage, "serialized">): Uint8Array {
  const w = new PbWriter().raw([(p.version << 4) | p.version]);
  if (p.preKeyId !== undefined) w.uint32(1, p.preKeyId);
  w.bytes(2, serializeKey(p.baseKey));
  w.bytes(3, serializeKey(p.identityKey));
  w.bytes(4, p.message.serialized);
  w.uint32(5, p.registrationId);
  w.uint32(6, p.signedPreKeyId);
  if (p.version >= VERSION_PQXDH) {
    w.uint32(7, p.kyberPreKeyId ?? 0);
    w.bytes(8, p.kyberCiphertext ?? new Uint8Array());
  }
  return w.finish();
}

export function parsePreKeySignalMessage(b: Uint8Array): PreKeySignalMessage {
  if (b.length < 1) throw malformed("empty PreKeySignalMessage");
  const v = checkVersion(b[0]);
  const f = parse(b.subarray(1), "PreKeySignalMessage");
  const r = fields("PreKeySignalMessage", () => ({
    pk: pbUint32(f, 1),
    base: pbBytes(f, 2),
    id: pbBytes(f, 3),
    msg: pbBytes(f, 4),
    reg: pbUint32(f, 5),
    spk: pbUint32(f, 6),
    kid: pbUint32(f, 7),
    kct: pbBytes(f, 8),
  }));
  if (!r.base || !r.id || !r.msg || r.spk === undefined) throw malformed("PreKeySignalMessage fields");
  if ((r.kid === undefined) !== (r.kct === undefined)) throw malformed("both or neither kyber_pre_key_id and kyber_ciphertext");
  if (v >= VERSION_PQXDH && r.kid === undefined) throw malformed("version 4 PreKeySignalMessage without a KEM ciphertext");
  const p: PreKeySignalMessage = {
    version: v,
    registrationId: r.reg ?? 0,
    preKeyId: r.pk,
    signedPreKeyId: r.spk,
    baseKey: decodeKey(r.base),
    identityKey: decodeKey(r.id),
    message: parseSignalMessage(r.msg),
    serialized: b.slice(),
  };
  if (v >= VERSION_PQXDH) {
    p.kyberPreKeyId = r.kid;
    p.kyberCiphertext = r.kct;
  }
  if (p.message.version !== v) throw malformed(`inner message version ${p.message.version} in a version ${v} PreKeySignalMessage`);
  return p;
}

// SenderKeyFormat: "modern" is today's libsignal (a distribution UUID and a
// chain id), "legacy" libsignal-protocol-c/Java's (a key id only).
export type SenderKeyFormat = "modern" | "legacy";

export interface SenderKeyMessage {
  distributionId: Uint8Array; // 16 bytes (zero in the legacy format)
  chainId: number;
  iteration: number;
  ciphertext: Uint8Array;
  serialized: Uint8Array;
}

export function encodeSenderKeyMessage(
  f: SenderKeyFormat,
  dist: Uint8Array,
  chain: number,
  iter: number,
  ct: Uint8Array,
  signPriv: Uint8Array,
): Uint8Array {
  const w = new PbWriter().raw([(SENDER_KEY_VERSION << 4) | SENDER_KEY_VERSION]);
  if (f === "legacy") w.uint32(1, chain).uint32(2, iter).bytes(3, ct);
  else w.bytes(1, dist).uint32(2, chain).uint32(3, iter).bytes(4, ct);
  const body = w.finish();
  return concat(body, sign(signPriv, body));
}

export function parseSenderKeyMessage(b: Uint8Array, f: SenderKeyFormat): SenderKeyMessage {
  if (b.length < 1 + SIG_LEN) throw malformed("SenderKeyMessage of " + b.length + " bytes");
  if (b[0] >> 4 !== SENDER_KEY_VERSION) throw fail("version", "unsupported message version: sender key " + (b[0] >> 4));
  const fs = parse(b.subarray(1, b.length - SIG_LEN), "SenderKeyMessage");
  let dist: Uint8Array = new Uint8Array(16);
  let chain, iter, ct;
  if (f === "legacy") {
    [chain, iter, ct] = fields("SenderKeyMessage", () => [pbUint32(fs, 1), pbUint32(fs, 2), pbBytes(fs, 3)] as const);
  } else {
    const d = fields("SenderKeyMessage", () => pbBytes(fs, 1));
    if (!d || d.length !== 16) throw malformed("SenderKeyMessage distribution id");
    dist = d;
    [chain, iter, ct] = fields("SenderKeyMessage", () => [pbUint32(fs, 2), pbUint32(fs, 3), pbBytes(fs, 4)] as const);
  }
  if (chain === undefined || iter === undefined || !ct) throw malformed("SenderKeyMessage fields");
  return { distributionId: dist, chainId: chain, iteration: iter, ciphertext: ct, serialized: b.slice() };
}

export function verifySenderKeyMessage(m: SenderKeyMessage, signingPub: Uint8Array): boolean {
  const n = m.serialized.length - SIG_LEN;
  return verify(signingPub, m.serialized.subarray(0, n), m.serialized.subarray(n));
}

export interface SenderKeyDistributionMessage {
  distributionId: Uint8Array;
  chainId: number;
  iteration: number;
  chainKey: Uint8Array;
  signingKey: Uint8Array; // 32 bytes
}

export function encodeDistribution(d: SenderKeyDistributionMessage, f: SenderKeyFormat): Uint8Array {
  const w = new PbWriter().raw([(SENDER_KEY_VERSION << 4) | SENDER_KEY_VERSION]);
  if (f === "legacy") {
    w.uint32(1, d.chainId).uint32(2, d.iteration).bytes(3, d.chainKey).bytes(4, serializeKey(d.signingKey));
  } else {
    w.bytes(1, d.distributionId).uint32(2, d.chainId).uint32(3, d.iteration).bytes(4, d.chainKey).bytes(5, serializeKey(d.signingKey));
  }
  return w.finish();
}

export function parseDistribution(b: Uint8Array, f: SenderKeyFormat): SenderKeyDistributionMessage {
  if (b.length < 1) throw malformed("empty SenderKeyDistributionMessage");
  if (b[0] >> 4 !== SENDER_KEY_VERSION) throw fail("version", "unsupported message version: sender key " + (b[0] >> 4));
  const fs = parse(b.subarray(1), "SenderKeyDistributionMessage");
  let dist: Uint8Array = new Uint8Array(16);
  let chain, iter, ck, sk;
  if (f === "legacy") {
    [chain, iter, ck, sk] = fields("SenderKeyDistributionMessage", () => [pbUint32(fs, 1), pbUint32(fs, 2), pbBytes(fs, 3), pbBytes(fs, 4)] as const);
  } else {
    const d = fields("SenderKeyDistributionMessage", () => pbBytes(fs, 1));
    if (!d || d.length !== 16) throw malformed("SenderKeyDistributionMessage distribution id");
    dist = d;
    [chain, iter, ck, sk] = fields("SenderKeyDistributionMessage", () => [pbUint32(fs, 2), pbUint32(fs, 3), pbBytes(fs, 4), pbBytes(fs, 5)] as const);
  }
  if (chain === undefined || iter === undefined || !ck || !sk || ck.length !== 32) throw malformed("SenderKeyDistributionMessage fields");
  return { distributionId: dist, chainId: chain, iteration: iter, chainKey: ck, signingKey: decodeKey(sk) };
}
