// Key transparency checks of protocol/kt, as client/e2eechat makes them
// (docs/protocol.md, "Key transparency"): the log's signed checkpoint (a
// C2SP signed note, Ed25519), the user's label (RFC 9381
// ECVRF-EDWARDS25519-SHA512-TAI over "parley kt v1\0" || user), the
// entry's inclusion in the checkpoint's tree and one checkpoint's
// consistency with another (RFC 9162 proofs, SHA-256), and the entry's
// encoding. Composed from @noble's Ed25519 group and hashes; no
// primitive is written here.

import { ed25519 } from "@noble/curves/ed25519.js";
import { sha256, sha512 } from "@noble/hashes/sha2.js";
import { concat, equal, fromBase64, toBase64, utf8 } from "./bytes.js";

export class KTError extends Error {
  constructor(
    readonly code: "kt_proof" | "kt_fork",
    message: string,
  ) {
    super("key transparency: " + message);
    this.name = "KTError";
  }
}
const proofErr = (m: string) => new KTError("kt_proof", m);
const b64 = (s: string): Uint8Array => {
  try {
    return fromBase64(s);
  } catch {
    throw proofErr("malformed base64");
  }
};
const forkErr = (m: string) => new KTError("kt_fork", m);

export interface Checkpoint {
  origin: string;
  size: number;
  root: Uint8Array;
}

export interface NoteKey {
  name: string;
  hash: Uint8Array; // 4 bytes
  pub: Uint8Array; // Ed25519
}

// parseNoteKey reads a note verifier key: "name+hash+base64(0x01 || key)".
export function parseNoteKey(vkey: string): NoteKey {
  const i = vkey.indexOf("+");
  const j = vkey.indexOf("+", i + 1);
  if (i <= 0 || j < 0) throw proofErr("malformed note key");
  const [name, hex, b64s] = [vkey.slice(0, i), vkey.slice(i + 1, j), vkey.slice(j + 1)];
  const raw = b64(b64s);
  if (raw.length !== 33 || raw[0] !== 0x01 || !/^[0-9a-f]{8}$/.test(hex)) throw proofErr("malformed note key");
  const hash = keyHash(name, raw);
  if (hex !== [...hash].map((x) => x.toString(16).padStart(2, "0")).join("")) throw proofErr("note key hash mismatch");
  return { name, hash, pub: raw.subarray(1) };
}

function keyHash(name: string, raw: Uint8Array): Uint8Array {
  return sha256(concat(utf8(name + "\n"), raw)).subarray(0, 4);
}

const MAX_CHECKPOINT_BYTES = 1024;

// openCheckpoint verifies a signed checkpoint with key and parses it (the
// body strictly: origin, size, root, no extension lines).
export function openCheckpoint(key: NoteKey, text: string): Checkpoint {
  if (text.length > MAX_CHECKPOINT_BYTES) throw proofErr(`checkpoint of ${text.length} bytes`);
  const i = text.indexOf("\n\n");
  if (i < 0 || !text.endsWith("\n")) throw proofErr("malformed checkpoint note");
  const body = text.slice(0, i + 1);
  let ok = false;
  for (const line of text.slice(i + 2, -1).split("\n")) {
    const m = /^\u2014 (\S+) (\S+)$/.exec(line);
    if (!m) throw proofErr("malformed checkpoint signature line");
    if (m[1] !== key.name) continue;
    const sig = b64(m[2]);
    if (sig.length !== 68 || !equal(sig.subarray(0, 4), key.hash)) continue;
    if (!ed25519.verify(sig.subarray(4), utf8(body), key.pub, { zip215: false })) throw proofErr("checkpoint signature does not verify");
    ok = true;
  }
  if (!ok) throw proofErr("checkpoint not signed by the pinned key");
  const lines = body.split("\n");
  if (lines.length !== 4 || lines[3] !== "" || !lines[0]) throw proofErr("checkpoint body: want three lines");
  if (!/^(0|[1-9][0-9]*)$/.test(lines[1]) || !Number.isSafeInteger(Number(lines[1]))) throw proofErr("checkpoint size");
  const root = b64(lines[2]);
  if (root.length !== 32 || toBase64(root) !== lines[2]) throw proofErr("checkpoint root");
  if (lines[0] !== key.name) throw proofErr(`checkpoint origin ${lines[0]}, want ${key.name}`);
  return { origin: lines[0], size: Number(lines[1]), root };
}

// --- VRF (RFC 9381, suite 0x03) ---

const SUITE = 0x03;
const L = ed25519.Point.CURVE().n;
const Point = ed25519.Point;
type Pt = InstanceType<typeof Point>;

function decodePoint(b: Uint8Array): Pt {
  const p = Point.fromBytes(b, false);
  if (!equal(p.toBytes(), b)) throw new Error("non-canonical point");
  return p;
}

function le(b: Uint8Array): bigint {
  let x = 0n;
  for (let i = b.length - 1; i >= 0; i--) x = (x << 8n) | BigInt(b[i]);
  return x;
}

function encodeToCurve(salt: Uint8Array, alpha: Uint8Array): Pt {
  for (let ctr = 0; ctr < 256; ctr++) {
    const h = sha512(concat(Uint8Array.of(SUITE, 0x01), salt, alpha, Uint8Array.of(ctr, 0x00)));
    let p: Pt;
    try {
      p = decodePoint(h.subarray(0, 32));
    } catch {
      continue;
    }
    return p.clearCofactor();
  }
  throw new Error("no curve point after 256 tries");
}

// vrfVerify returns the VRF output (beta, 64 bytes) of alpha under pub.
export function vrfVerify(pub: Uint8Array, alpha: Uint8Array, proof: Uint8Array): Uint8Array {
  if (proof.length !== 80) throw proofErr(`vrf proof of ${proof.length} bytes`);
  let y: Pt, gamma: Pt;
  try {
    y = decodePoint(pub);
    gamma = decodePoint(proof.subarray(0, 32));
  } catch {
    throw proofErr("vrf: bad point");
  }
  if (y.isSmallOrder()) throw proofErr("vrf: public key of small order");
  const c = proof.subarray(32, 48);
  const s = le(proof.subarray(48, 80));
  if (s >= L) throw proofErr("vrf: s not canonical");
  const h = encodeToCurve(pub, alpha);
  const cs = le(c);
  const negC = (L - cs) % L;
  const mul = (p: Pt, k: bigint) => (k === 0n ? Point.ZERO : p.multiplyUnsafe(k));
  const u = mul(Point.BASE, s).add(mul(y, negC));
  const v = mul(h, s).add(mul(gamma, negC));
  const want = sha512(concat(Uint8Array.of(SUITE, 0x02), pub, h.toBytes(), gamma.toBytes(), u.toBytes(), v.toBytes(), Uint8Array.of(0x00))).subarray(0, 16);
  if (!equal(want, c)) throw proofErr("vrf proof does not verify");
  return sha512(concat(Uint8Array.of(SUITE, 0x03), gamma.clearCofactor().toBytes(), Uint8Array.of(0x00)));
}

// label is the user's label in the log: the first 32 bytes of the VRF
// output of "parley kt v1\0" || user.
export function verifyLabel(vrfKey: Uint8Array, user: string, proof: Uint8Array): Uint8Array {
  return vrfVerify(vrfKey, concat(utf8("parley kt v1\0"), utf8(user)), proof).slice(0, 32);
}

// --- RFC 9162 Merkle proofs ---

const leafHash = (e: Uint8Array) => sha256(concat(Uint8Array.of(0), e));
const nodeHash = (l: Uint8Array, r: Uint8Array) => sha256(concat(Uint8Array.of(1), l, r));
export const emptyRoot = () => sha256(new Uint8Array());

export function verifyInclusion(c: Checkpoint, index: number, entry: Uint8Array, path: Uint8Array[]): void {
  if (index >= c.size) throw proofErr(`index ${index} in a log of ${c.size}`);
  let fn = index;
  let sn = c.size - 1;
  let r = leafHash(entry);
  for (const p of path) {
    if (sn === 0) throw proofErr("inclusion proof too long");
    if (fn % 2 === 1 || fn === sn) {
      r = nodeHash(p, r);
      if (fn % 2 === 0) while (fn % 2 === 0 && fn !== 0) {
        fn = Math.floor(fn / 2);
        sn = Math.floor(sn / 2);
      }
    } else r = nodeHash(r, p);
    fn = Math.floor(fn / 2);
    sn = Math.floor(sn / 2);
  }
  if (sn !== 0 || !equal(r, c.root)) throw proofErr("inclusion proof does not verify");
}

export function verifyConsistency(a: Checkpoint, b: Checkpoint, path: Uint8Array[]): void {
  if (a.origin !== b.origin) throw forkErr(`origins ${a.origin} and ${b.origin}`);
  if (b.size < a.size) throw forkErr(`size ${b.size} after ${a.size} (rolled back)`);
  if (a.size === 0) {
    if (!equal(a.root, emptyRoot())) throw forkErr("empty log with a non-empty root");
    return;
  }
  if (a.size === b.size) {
    if (!equal(a.root, b.root) || path.length) throw forkErr(`two roots for size ${a.size}`);
    return;
  }
  if (path.length === 0) throw forkErr("empty consistency proof");
  let p = path;
  // a.size a power of two: the old root is the proof's implicit first node.
  if (Number.isInteger(Math.log2(a.size))) p = [a.root, ...path];
  let fn = a.size - 1;
  let sn = b.size - 1;
  while (fn % 2 === 1) {
    fn = Math.floor(fn / 2);
    sn = Math.floor(sn / 2);
  }
  let fr = p[0];
  let sr = p[0];
  for (const c of p.slice(1)) {
    if (sn === 0) throw forkErr("consistency proof too long");
    if (fn % 2 === 1 || fn === sn) {
      fr = nodeHash(c, fr);
      sr = nodeHash(c, sr);
      if (fn % 2 === 0) while (fn % 2 === 0 && fn !== 0) {
        fn = Math.floor(fn / 2);
        sn = Math.floor(sn / 2);
      }
    } else sr = nodeHash(sr, c);
    fn = Math.floor(fn / 2);
    sn = Math.floor(sn / 2);
  }
  if (sn !== 0 || !equal(fr, a.root) || !equal(sr, b.root)) throw forkErr(`sizes ${a.size} to ${b.size}: consistency proof does not verify`);
}

// --- Entries (protocol/kt entry.go) ---

export interface Entry {
  label: Uint8Array;
  version: number;
  account: Uint8Array;
  devices: { id: string; identityKey: Uint8Array; sig: Uint8Array }[];
}

export function parseEntry(b: Uint8Array): Entry {
  let o = 0;
  const need = (n: number) => {
    if (o + n > b.length) throw proofErr("entry truncated");
    const v = b.subarray(o, o + n);
    o += n;
    return v;
  };
  const u64 = () => {
    const v = need(8);
    let x = 0n;
    for (const c of v) x = (x << 8n) | BigInt(c);
    return x;
  };
  const short = () => need(need(1)[0]);
  if (need(1)[0] !== 0x01) throw proofErr("entry format");
  const label = need(32);
  const version = u64();
  const prev = need(32);
  const time = u64();
  const account = short();
  const nb = need(2);
  const n = (nb[0] << 8) | nb[1];
  if (n > 1000) throw proofErr(`entry of ${n} devices`);
  const devices: Entry["devices"] = [];
  for (let i = 0; i < n; i++) {
    let id: string;
    try {
      id = new TextDecoder("utf-8", { fatal: true }).decode(short());
    } catch (e) {
      if (e instanceof KTError) throw e;
      throw proofErr("entry: device id not UTF-8");
    }
    devices.push({ id, identityKey: short(), sig: short() });
  }
  if (o !== b.length) throw proofErr("entry: trailing bytes");
  if (version === 0n || version > BigInt(Number.MAX_SAFE_INTEGER)) throw proofErr("entry version");
  if ((version === 1n) !== prev.every((x) => x === 0)) throw proofErr("entry prev");
  if (time >= 1n << 63n) throw proofErr("entry time");
  if (account.length !== 0 && account.length !== 33) throw proofErr("entry account key");
  for (let i = 0; i < devices.length; i++) {
    const d = devices[i];
    if (!d.id || utf8(d.id).length > 64 || d.identityKey.length !== 33 || (d.sig.length !== 0 && d.sig.length !== 64)) throw proofErr("entry device");
    if (i > 0 && !(devices[i - 1].id < d.id)) throw proofErr("entry devices not sorted");
  }
  return { label, version: Number(version), account, devices };
}
