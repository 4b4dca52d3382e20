// Safety numbers: libsignal's displayable fingerprint (60 digits, the same
// on both sides), as client/e2ee.SafetyNumber computes it: Parley's stable
// ids are user ids and the keys are the users' account keys.

import { sha512 } from "@noble/hashes/sha2.js";
import { concat, utf8 } from "./bytes.js";
import { serializeKey } from "./curve.js";

export const FINGERPRINT_ITERATIONS = 5200;

function fingerprintHash(stableId: string, key: Uint8Array, iterations: number): Uint8Array {
  const kb = serializeKey(key);
  let buf = sha512(concat(Uint8Array.of(0, 0), kb, utf8(stableId), kb));
  for (let i = 1; i < iterations; i++) buf = sha512(concat(buf, kb));
  return buf;
}

function digits(b: Uint8Array): string {
  let s = "";
  for (let i = 0; i < 6; i++) {
    let x = 0;
    for (const c of b.subarray(i * 5, i * 5 + 5)) x = x * 256 + c;
    s += String(x % 100000).padStart(5, "0");
  }
  return s;
}

// safetyNumber of two identities (keys: 32-byte Montgomery u).
export function safetyNumber(localId: string, localKey: Uint8Array, remoteId: string, remoteKey: Uint8Array): string {
  const l = digits(fingerprintHash(localId, localKey, FINGERPRINT_ITERATIONS));
  const r = digits(fingerprintHash(remoteId, remoteKey, FINGERPRINT_ITERATIONS));
  return l < r ? l + r : r + l;
}

// formatSafetyNumber groups a safety number in blocks of five digits.
export function formatSafetyNumber(n: string): string {
  const parts: string[] = [];
  for (let i = 0; i + 5 <= n.length; i += 5) parts.push(n.slice(i, i + 5));
  return parts.join(" ");
}
