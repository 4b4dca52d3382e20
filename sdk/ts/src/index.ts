export * from "./client.js";
export * from "./frames.js";
export * from "./errors.js";
// Named, not starred: frames.ts (generated from the schema) has types of the
// same names, and an explicit export is the one that counts.
export {
  resolveURL, type AttachmentInfo, type Download, type DownloadOptions, type FileBody, type ResumeOptions, type SendFileOptions,
  type UploadData, type UploadInfo, type UploadOptions, type UploadProgress, type UploadSource,
} from "./attach.js";
export { Sha256 } from "./sha256.js";
export { Backoff } from "./backoff.js";
export { ConvOrder } from "./order.js";
export { HandshakeError, type WebSocketCtor, type WebSocketLike, type Transport } from "./transport.js";
