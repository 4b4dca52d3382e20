// Signal's attachment scheme, as client/e2ee's attachment.go: a fresh
// 64-byte key per file (AES-256 key ‖ HMAC-SHA256 key), the plaintext
// padded with zeros to a size bucket (paddedSize) then PKCS#7, and
// IV(16) ‖ AES-256-CBC ‖ HMAC-SHA256(IV ‖ ciphertext), with a SHA-256
// digest of the whole that travels inside the message. Decryption checks
// digest and MAC before it decrypts a byte. Whole buffers here (a page
// holds the file anyway); the Go SDK streams.

import { hmac } from "@noble/hashes/hmac.js";
import { sha256 } from "@noble/hashes/sha2.js";
import { concat, equal, randomBytes } from "./bytes.js";
import { fail } from "./errors.js";

export const ATTACHMENT_KEY_SIZE = 64;
const IV = 16;
const MAC = 32;
const MIN_PADDED = 541;

const bad = (code: "attachment_digest" | "attachment_mac" | "attachment_format", msg: string) => fail(code, msg.replace(/^e2ee: /, ""));

export const newAttachmentKey = (): Uint8Array => randomBytes(ATTACHMENT_KEY_SIZE);

// paddedSize is the size bucket a plaintext of size bytes is padded to:
// at least 541 bytes, then the next power of 1.05 (Signal's buckets).
export function paddedSize(size: number): number {
  if (size <= MIN_PADDED) return MIN_PADDED;
  const p = Math.floor(Math.pow(1.05, Math.ceil(Math.log(size) / Math.log(1.05))));
  return Math.max(p, size);
}

export const encryptedSize = (size: number): number => IV + (Math.floor(paddedSize(size) / 16) + 1) * 16 + MAC;

async function aesKey(key: Uint8Array, use: KeyUsage): Promise<CryptoKey> {
  return globalThis.crypto.subtle.importKey("raw", key.slice(0, 32) as BufferSource, "AES-CBC", false, [use]);
}

// encryptAttachment returns the encrypted file and its digest.
export async function encryptAttachment(plain: Uint8Array, key: Uint8Array, iv: Uint8Array = randomBytes(IV)): Promise<{ data: Uint8Array; digest: Uint8Array }> {
  if (key.length !== ATTACHMENT_KEY_SIZE) throw bad("attachment_format", "e2ee: malformed attachment: key of " + key.length + " bytes");
  const padded = new Uint8Array(paddedSize(plain.length));
  padded.set(plain);
  const ct = new Uint8Array(await globalThis.crypto.subtle.encrypt({ name: "AES-CBC", iv: iv as BufferSource }, await aesKey(key, "encrypt"), padded as BufferSource));
  const body = concat(iv, ct);
  const mac = hmac(sha256, key.subarray(32), body);
  const data = concat(body, mac);
  return { data, digest: sha256(data) };
}

// decryptAttachment checks digest and MAC, then returns the first size
// bytes of the plaintext.
export async function decryptAttachment(data: Uint8Array, key: Uint8Array, digest: Uint8Array, size: number): Promise<Uint8Array> {
  if (key.length !== ATTACHMENT_KEY_SIZE) throw bad("attachment_format", "e2ee: malformed attachment: key of " + key.length + " bytes");
  if (digest.length !== 32) throw bad("attachment_format", "e2ee: malformed attachment: digest of " + digest.length + " bytes");
  const body = data.length - IV - MAC;
  if (body < 16 || body % 16 !== 0) throw bad("attachment_format", "e2ee: malformed attachment: " + data.length + " bytes");
  if (!equal(sha256(data), digest)) throw bad("attachment_digest", "e2ee: attachment digest mismatch");
  const mac = hmac(sha256, key.subarray(32), data.subarray(0, data.length - MAC));
  if (!equal(mac, data.subarray(data.length - MAC))) throw bad("attachment_mac", "e2ee: attachment MAC mismatch");
  if (size < 0 || size > body - 1) throw bad("attachment_format", `e2ee: malformed attachment: size ${size} beyond the ${body} bytes encrypted`);
  let plain: Uint8Array;
  try {
    plain = new Uint8Array(
      await globalThis.crypto.subtle.decrypt({ name: "AES-CBC", iv: data.slice(0, IV) as BufferSource }, await aesKey(key, "decrypt"), data.slice(IV, IV + body) as BufferSource),
    );
  } catch {
    throw bad("attachment_format", "e2ee: malformed attachment: bad padding");
  }
  if (size > plain.length) throw bad("attachment_format", `e2ee: malformed attachment: size ${size} beyond the ${plain.length} bytes of plaintext`);
  return plain.slice(0, size);
}
