// ML-KEM-1024 (FIPS 203) on @noble/post-quantum, in libsignal's
// serialization: a type byte 0x0A before the encapsulation key and the
// ciphertext. A key pair is kept as its 64-byte seed (d || z), as Go's
// crypto/mlkem keeps it.

import { ml_kem1024 } from "@noble/post-quantum/ml-kem.js";
import { concat, randomBytes } from "./bytes.js";
import { fail } from "./errors.js";

export const KEM_TYPE = 0x0a;
const PUB_LEN = 1568;
const CT_LEN = 1568;

export interface KEMKeyPair {
  seed: Uint8Array; // 64 bytes
  pub: Uint8Array; // KEM_TYPE || encapsulation key
}

export function kemFromSeed(seed: Uint8Array): KEMKeyPair {
  const { publicKey } = ml_kem1024.keygen(seed);
  return { seed: seed.slice(), pub: concat(Uint8Array.of(KEM_TYPE), publicKey) };
}

export function generateKEMKeyPair(): KEMKeyPair {
  return kemFromSeed(randomBytes(64));
}

export function kemEncapsulate(pub: Uint8Array): { ss: Uint8Array; ct: Uint8Array } {
  if (pub.length !== 1 + PUB_LEN || pub[0] !== KEM_TYPE) {
    throw fail("bad_key", "malformed key: ML-KEM-1024 public key of " + pub.length + " bytes");
  }
  let r;
  try {
    r = ml_kem1024.encapsulate(pub.subarray(1));
  } catch (e) {
    throw fail("bad_key", "malformed key: " + (e as Error).message);
  }
  return { ss: r.sharedSecret, ct: concat(Uint8Array.of(KEM_TYPE), r.cipherText) };
}

export function kemDecapsulate(k: KEMKeyPair, ct: Uint8Array): Uint8Array {
  if (ct.length !== 1 + CT_LEN || ct[0] !== KEM_TYPE) {
    throw fail("bad_key", "malformed key: ML-KEM-1024 ciphertext of " + ct.length + " bytes");
  }
  const { secretKey } = ml_kem1024.keygen(k.seed);
  return ml_kem1024.decapsulate(ct.subarray(1), secretKey);
}
