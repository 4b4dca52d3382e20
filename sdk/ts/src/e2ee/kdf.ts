// Key derivations of libsignal (HKDF-SHA256, HMAC-SHA256 chains, on
// @noble/hashes: synchronous, so that a receiver steps a chain over
// thousands of skipped keys without a round trip per step) and message
// encryption (AES-256-CBC with PKCS#7 padding, on WebCrypto).

import { hkdf } from "@noble/hashes/hkdf.js";
import { hmac } from "@noble/hashes/hmac.js";
import { sha256 } from "@noble/hashes/sha2.js";
import { concat, utf8 } from "./bytes.js";
import { agree } from "./curve.js";
import { fail } from "./errors.js";

export const LABEL_X3DH = "WhisperText";
export const LABEL_PQXDH = "WhisperText_X25519_SHA-256_CRYSTALS-KYBER-1024";
export const LABEL_RATCHET = "WhisperRatchet";
export const LABEL_MESSAGE_KEYS = "WhisperMessageKeys";
export const LABEL_GROUP = "WhisperGroup";

export function hmacSHA256(key: Uint8Array, ...data: Uint8Array[]): Uint8Array {
  return hmac(sha256, key, concat(...data));
}

export function hkdfSHA256(secret: Uint8Array, salt: Uint8Array | undefined, info: string, n: number): Uint8Array {
  return hkdf(sha256, secret, salt, utf8(info), n);
}

// ChainKey is a symmetric-ratchet chain key (KDF_CK: HMAC-SHA256 with 0x01
// for the message key seed and 0x02 for the next chain key).
export interface ChainKey {
  key: Uint8Array;
  index: number;
}

const ONE = Uint8Array.of(1);
const TWO = Uint8Array.of(2);

export const nextChain = (c: ChainKey): ChainKey => ({ key: hmacSHA256(c.key, TWO), index: c.index + 1 });
export const messageSeed = (c: ChainKey): Uint8Array => hmacSHA256(c.key, ONE);

export interface MessageKeys {
  cipher: Uint8Array;
  mac: Uint8Array;
  iv: Uint8Array;
}

export function deriveMessageKeys(seed: Uint8Array): MessageKeys {
  const okm = hkdfSHA256(seed, undefined, LABEL_MESSAGE_KEYS, 80);
  return { cipher: okm.slice(0, 32), mac: okm.slice(32, 64), iv: okm.slice(64, 80) };
}

// createChain is KDF_RK: a DH ratchet step from root key rk.
export function createChain(rk: Uint8Array, their: Uint8Array, ourPriv: Uint8Array): { root: Uint8Array; ck: ChainKey } {
  const shared = agree(ourPriv, their);
  const okm = hkdfSHA256(shared, rk, LABEL_RATCHET, 64);
  return { root: okm.slice(0, 32), ck: { key: okm.slice(32), index: 0 } };
}

export function deriveInitial(secret: Uint8Array, pq: boolean): { root: Uint8Array; ck: ChainKey } {
  const okm = hkdfSHA256(secret, undefined, pq ? LABEL_PQXDH : LABEL_X3DH, 64);
  return { root: okm.slice(0, 32), ck: { key: okm.slice(32), index: 0 } };
}

export function groupMessageKey(seed: Uint8Array): { iv: Uint8Array; key: Uint8Array } {
  const okm = hkdfSHA256(seed, undefined, LABEL_GROUP, 48);
  return { iv: okm.slice(0, 16), key: okm.slice(16) };
}

const subtle = (): SubtleCrypto => {
  const s = globalThis.crypto?.subtle;
  if (!s) throw new Error("e2ee: WebCrypto (crypto.subtle) is not available here");
  return s;
};

export async function aesCBCEncrypt(key: Uint8Array, iv: Uint8Array, plain: Uint8Array): Promise<Uint8Array> {
  const k = await subtle().importKey("raw", key as BufferSource, "AES-CBC", false, ["encrypt"]);
  return new Uint8Array(await subtle().encrypt({ name: "AES-CBC", iv: iv as BufferSource }, k, plain as BufferSource));
}

export async function aesCBCDecrypt(key: Uint8Array, iv: Uint8Array, ct: Uint8Array): Promise<Uint8Array> {
  if (ct.length === 0 || ct.length % 16 !== 0) throw fail("decrypt_failure", "decryption failed: bad padding");
  const k = await subtle().importKey("raw", key as BufferSource, "AES-CBC", false, ["decrypt"]);
  try {
    return new Uint8Array(await subtle().decrypt({ name: "AES-CBC", iv: iv as BufferSource }, k, ct as BufferSource));
  } catch {
    throw fail("decrypt_failure", "decryption failed: bad padding");
  }
}
