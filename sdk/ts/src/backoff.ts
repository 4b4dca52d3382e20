/**
 * Reconnect and retry delays with "full jitter", as the Go SDK: attempt n
 * waits uniformly in [0, min(max, min·2^n)), so a crowd of clients that lost
 * the same node spreads over the whole window instead of arriving as one
 * wave. A delay the server asked for (retry_after_ms, Retry-After, goaway)
 * gets up to half of it again as jitter (at least min).
 */
export class Backoff {
  constructor(
    readonly minMs: number,
    readonly maxMs: number,
    private readonly random: () => number = Math.random,
  ) {}

  /** Upper bound of the window for attempt n (0-based). */
  ceiling(attempt: number): number {
    let c = this.minMs;
    for (let i = 0; i < attempt && c < this.maxMs; i++) c *= 2;
    return Math.min(c, this.maxMs);
  }

  /** The jittered delay for attempt n. */
  delay(attempt: number): number {
    return Math.floor(this.random() * this.ceiling(attempt));
  }

  /** A server-requested delay plus jitter of up to half of it. */
  after(askedMs: number): number {
    const spread = Math.max(askedMs / 2, this.minMs);
    return Math.floor(askedMs + this.random() * spread);
  }
}
