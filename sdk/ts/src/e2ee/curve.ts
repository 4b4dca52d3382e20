// Curve25519 keys in libsignal's form and XEdDSA signatures
// (signal.org/docs/specifications/xeddsa), on @noble/curves: X25519 for
// agreement, the Edwards group of ed25519 for signing. libsignal's
// variant: the Edwards public key is derived from the clamped scalar as is
// (no negation) and the sign bit of its x coordinate travels in the top
// bit of the signature's last byte, where the verifier picks it up to lift
// the Montgomery key. The same scheme signs device certificates with the
// account key (DeviceCertMessage).

import { ed25519, x25519 } from "@noble/curves/ed25519.js";
import { sha512 } from "@noble/hashes/sha2.js";
import { concat, randomBytes, utf8 } from "./bytes.js";
import { fail } from "./errors.js";

export const DJB_TYPE = 0x05;

export interface KeyPair {
  priv: Uint8Array; // clamped X25519 scalar, 32 bytes
  pub: Uint8Array; // Montgomery u, 32 bytes (unserialized)
}

export function clamp(k: Uint8Array): Uint8Array {
  const c = k.slice();
  c[0] &= 248;
  c[31] &= 127;
  c[31] |= 64;
  return c;
}

export function keyPairFromPrivate(priv: Uint8Array): KeyPair {
  if (priv.length !== 32) throw fail("bad_key", "private key of " + priv.length + " bytes");
  const p = clamp(priv);
  return { priv: p, pub: x25519.getPublicKey(p) };
}

export function generateKeyPair(): KeyPair {
  return keyPairFromPrivate(randomBytes(32));
}

// serializeKey is libsignal's 33-byte form: 0x05 || u.
export function serializeKey(pub: Uint8Array): Uint8Array {
  return concat(Uint8Array.of(DJB_TYPE), pub);
}

export function decodeKey(b: Uint8Array): Uint8Array {
  if (b.length !== 33 || b[0] !== DJB_TYPE) {
    throw fail("bad_key", "malformed key: want 33 bytes starting with 0x05, got " + b.length);
  }
  return b.slice(1);
}

// agree is X25519(priv, pub); a low-order public key (all-zero output) is
// refused.
export function agree(priv: Uint8Array, pub: Uint8Array): Uint8Array {
  let s: Uint8Array;
  try {
    s = x25519.getSharedSecret(priv, pub);
  } catch {
    throw fail("low_order_key", "low-order or invalid public key");
  }
  let z = 0;
  for (const c of s) z |= c;
  if (z === 0) throw fail("low_order_key", "low-order or invalid public key");
  return s;
}

const Point = ed25519.Point;
const N = Point.Fn.ORDER;
const P = Point.Fp.ORDER;

function leBig(b: Uint8Array): bigint {
  let x = 0n;
  for (let i = b.length - 1; i >= 0; i--) x = (x << 8n) | BigInt(b[i]);
  return x;
}

function modN(x: bigint): bigint {
  const r = x % N;
  return r < 0n ? r + N : r;
}

function modP(x: bigint): bigint {
  const r = x % P;
  return r < 0n ? r + P : r;
}

const PREFIX = (() => {
  const p = new Uint8Array(32).fill(0xff);
  p[0] = 0xfe;
  return p;
})();

// sign makes a 64-byte XEdDSA signature of msg with the private key
// (z: 64 random bytes; given only by known-answer tests).
export function sign(priv: Uint8Array, msg: Uint8Array, z: Uint8Array = randomBytes(64)): Uint8Array {
  const k = clamp(priv);
  const a = modN(leBig(k));
  const A = Point.BASE.multiply(a).toBytes();
  const signBit = A[31] & 0x80;
  const r = modN(leBig(sha512(concat(PREFIX, priv, msg, z))));
  const R = Point.BASE.multiply(r).toBytes();
  const h = modN(leBig(sha512(concat(R, A, msg))));
  const s = modN(h * a + r);
  const sig = new Uint8Array(64);
  sig.set(R, 0);
  sig.set(Point.Fn.toBytes(s), 32);
  sig[63] = (sig[63] & 0x7f) | signBit;
  return sig;
}

// verify checks an XEdDSA signature by the owner of the Montgomery key
// pub (32 bytes), as protocol/e2ekeys.PublicKey.Verify does.
export function verify(pub: Uint8Array, msg: Uint8Array, sig: Uint8Array): boolean {
  if (pub.length !== 32 || sig.length !== 64) return false;
  const ub = pub.slice();
  ub[31] &= 0x7f;
  const u = modP(leBig(ub));
  const den = modP(u + 1n);
  if (den === 0n) return false;
  const y = Point.Fp.mul(modP(u - 1n), Point.Fp.inv(den));
  const enc = Point.Fp.toBytes(y);
  enc[31] |= sig[63] & 0x80;
  let A;
  try {
    A = Point.fromBytes(enc);
  } catch {
    return false;
  }
  const sb = sig.slice(32);
  sb[31] &= 0x7f;
  if ((sb[31] & 0xe0) !== 0) return false;
  const s = modN(leBig(sb));
  const h = modN(leBig(sha512(concat(sig.subarray(0, 32), A.toBytes(), msg))));
  const check = Point.BASE.multiplyUnsafe(s).add(A.negate().multiplyUnsafe(h)).toBytes();
  let d = 0;
  for (let i = 0; i < 32; i++) d |= check[i] ^ sig[i];
  return d === 0;
}

// deviceCertMessage is what an account key signs to certify a device
// (protocol/e2ekeys.DeviceCertMessage):
// "parley device certificate v1" || 0x00 || u16be(len user) || user ||
// u16be(len device) || device || identityKey (33 bytes).
export function deviceCertMessage(user: string, device: string, identityKey: Uint8Array): Uint8Array {
  const u = utf8(user).subarray(0, 0xffff);
  const d = utf8(device).subarray(0, 0xffff);
  const len = (n: number) => Uint8Array.of(n >> 8, n & 0xff);
  return concat(utf8("parley device certificate v1"), Uint8Array.of(0), len(u.length), u, len(d.length), d, identityKey);
}

// verifyDeviceCert: sig is accountKey's (serialized, 33 bytes) signature
// over the certificate of user/device with identityKey (33 bytes).
export function verifyDeviceCert(
  accountKey: Uint8Array,
  user: string,
  device: string,
  identityKey: Uint8Array,
  sig: Uint8Array,
): boolean {
  if (accountKey.length !== 33 || accountKey[0] !== DJB_TYPE) return false;
  if (identityKey.length !== 33 || identityKey[0] !== DJB_TYPE) return false;
  if (utf8(user).length > 0xffff || utf8(device).length > 0xffff) return false;
  return verify(accountKey.subarray(1), deviceCertMessage(user, device, identityKey), sig);
}
