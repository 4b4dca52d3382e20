// Errors of the E2E code. Each carries a code named after client/e2ee's
// sentinel error of the same meaning (ErrBadMAC → "bad_mac"), so that a
// caller tells them apart with `err.code` whichever SDK it speaks to.

export type E2EECode =
  | "bad_key"
  | "low_order_key"
  | "bad_signature"
  | "malformed"
  | "version"
  | "bad_mac"
  | "duplicate"
  | "too_far_ahead"
  | "no_session"
  | "invalid_prekey"
  | "untrusted"
  | "no_sender_key"
  | "bad_bundle"
  | "decrypt_failure"
  | "downgrade"
  | "reused_base_key"
  | "no_account"
  | "bad_certificate"
  | "verified_changed"
  | "locked"
  | "attachment_digest"
  | "attachment_mac"
  | "attachment_format";

export class E2EEError extends Error {
  readonly code: E2EECode;
  constructor(code: E2EECode, message: string) {
    super("e2ee: " + message);
    this.name = "E2EEError";
    this.code = code;
  }
}

export const fail = (code: E2EECode, message: string): E2EEError => new E2EEError(code, message);
