export * from "./client.js";
export * from "./frames.js";
export * from "./errors.js";
export * from "./attach.js";
export { Sha256 } from "./sha256.js";
export { Backoff } from "./backoff.js";
export { ConvOrder } from "./order.js";
export { HandshakeError } from "./transport.js";
