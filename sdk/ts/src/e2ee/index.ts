// Parley's end-to-end encryption for TypeScript (browsers and Node): the
// Signal protocols of client/e2ee, byte for byte on the wire — XEdDSA,
// X3DH + PQXDH (ML-KEM-1024), the Double Ratchet with libsignal's limits,
// Sender Keys, safety numbers, account keys and device certificates, the
// E2E envelope. The Node file store is in ./filestore.js (not imported
// here, so that a page bundle does not pull in node:fs).

export * from "./bytes.js";
export * from "./curve.js";
export * from "./device.js";
export * from "./envelope.js";
export * from "./errors.js";
export * from "./fingerprint.js";
export * from "./kdf.js";
export * from "./kem.js";
export * from "./messages.js";
export * from "./ratchet.js";
export * from "./store.js";
export * from "./weblock.js";
export * from "./chat.js";
export * from "./attachment.js";
export * from "./kt.js";
