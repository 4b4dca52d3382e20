export * from "./client.js";
export * from "./frames.js";
export { Backoff } from "./backoff.js";
export { ConvOrder } from "./order.js";
export { HandshakeError } from "./transport.js";
