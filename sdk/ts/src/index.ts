export * from "./client.js";
export * from "./frames.js";
export { Backoff } from "./backoff.js";
export { ConvOrder } from "./order.js";
export { HandshakeError, type WebSocketCtor, type WebSocketLike, type Transport } from "./transport.js";
