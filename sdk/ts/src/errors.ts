/** An error answer from the server (or a local failure with a code). */
export class ParleyError extends Error {
  constructor(readonly code: string, message: string, readonly retryAfterMs = 0) {
    super(`${code}: ${message}`);
  }
  /** Whether the same request may be retried (docs/protocol.md, Error codes). */
  get retryable(): boolean {
    return retryableCodes.has(this.code);
  }
}

const retryableCodes = new Set([
  "store_unavailable", "internal", "timeout", "overloaded", "rate_limited", "connection_lost", "request_timeout", "not_ready",
]);

/** The user's storage quota would be exceeded (upload_create; HTTP 413). */
export class QuotaExceededError extends ParleyError {}
/** The user has the most uploads in flight already (upload_create; HTTP 429). */
export class TooManyUploadsError extends ParleyError {}
/** A part or the file has more or fewer bytes than declared. */
export class SizeMismatchError extends ParleyError {}
/** The completed file's SHA-256 is not the declared one (the server deleted the upload), or a download's bytes are not the file's. */
export class HashMismatchError extends ParleyError {}
/**
 * A part other than the next one expected. received, when the server said
 * it (the upload endpoint's 409 does), is how many parts it has.
 */
export class PartOutOfOrderError extends ParleyError {
  constructor(code: string, message: string, retryAfterMs = 0, readonly received = -1) {
    super(code, message, retryAfterMs);
  }
}
/** The upload is not complete (completion before every part, or a file message naming it). */
export class UploadIncompleteError extends ParleyError {}
/** The thumbnail is still being made; retry after retryAfterMs (retryable). */
export class NotReadyError extends ParleyError {}

const classes: Record<string, new (code: string, message: string, retryAfterMs: number) => ParleyError> = {
  quota_exceeded: QuotaExceededError,
  too_many_uploads: TooManyUploadsError,
  size_mismatch: SizeMismatchError,
  hash_mismatch: HashMismatchError,
  part_out_of_order: PartOutOfOrderError,
  upload_incomplete: UploadIncompleteError,
  not_ready: NotReadyError,
};

/** The ParleyError (or its subclass for an attachment code) of an error answer. */
export function parleyError(code: string, message: string, retryAfterMs = 0): ParleyError {
  const C = classes[code] ?? ParleyError;
  return new C(code, message, retryAfterMs);
}
