// The E2E envelope a message body carries in an E2E conversation
// (docs/protocol.md, "E2E conversations"): exactly
// {"e2e":1,"to":[{"user","device","type","body"}],"group":"…"} with
// base64 bodies; type 3 is a PreKeySignalMessage, 2 a SignalMessage, and
// group one SenderKeyMessage for every member device.

import { fromBase64, toBase64 } from "./bytes.js";
import { fail } from "./errors.js";

export const MAX_ENVELOPE_TO = 200;

export interface EnvelopeTo {
  user: string;
  device: string;
  type: 2 | 3;
  body: Uint8Array;
}
export interface Envelope {
  to: EnvelopeTo[];
  group?: Uint8Array;
}

export function encodeEnvelope(e: Envelope): string {
  const o: Record<string, unknown> = { e2e: 1 };
  if (e.to.length) o.to = e.to.map((t) => ({ user: t.user, device: t.device, type: t.type, body: toBase64(t.body) }));
  if (e.group) o.group = toBase64(e.group);
  return JSON.stringify(o);
}

const VALID_ID = /^[A-Za-z0-9._@-]{1,64}$/;

// parseEnvelope reads an envelope with the server's checks
// (protocol.ParseEnvelope): unknown fields and other shapes are refused.
export function parseEnvelope(body: string): Envelope {
  let o: unknown;
  try {
    o = JSON.parse(body);
  } catch {
    throw fail("malformed", "malformed message: not an E2E envelope");
  }
  const bad = (why: string) => fail("malformed", "malformed message: E2E envelope: " + why);
  if (!o || typeof o !== "object" || Array.isArray(o)) throw bad("not an object");
  const r = o as Record<string, unknown>;
  for (const k of Object.keys(r)) if (k !== "e2e" && k !== "to" && k !== "group") throw bad("unknown field " + k);
  if (r.e2e !== 1) throw bad("e2e is not 1");
  const out: Envelope = { to: [] };
  if (r.to !== undefined && r.to !== null) {
    if (!Array.isArray(r.to)) throw bad("to is not a list");
    if (r.to.length > MAX_ENVELOPE_TO) throw bad(`${r.to.length} recipients, over ${MAX_ENVELOPE_TO}`);
    for (const t of r.to as Record<string, unknown>[]) {
      if (!t || typeof t !== "object") throw bad("recipient is not an object");
      for (const k of Object.keys(t)) if (!["user", "device", "type", "body"].includes(k)) throw bad("unknown field " + k);
      if (typeof t.user !== "string" || !VALID_ID.test(t.user) || typeof t.device !== "string" || !VALID_ID.test(t.device)) {
        throw bad("recipient is not a valid user/device");
      }
      if (t.type !== 2 && t.type !== 3) throw bad("ciphertext type " + String(t.type));
      if (typeof t.body !== "string" || t.body === "") throw bad("empty body");
      out.to.push({ user: t.user, device: t.device, type: t.type, body: fromBase64(t.body) });
    }
  }
  if (r.group !== undefined && r.group !== null) {
    if (typeof r.group !== "string" || r.group === "") throw bad("group is not base64");
    out.group = fromBase64(r.group);
  }
  if (!out.to.length && !out.group) throw bad("neither to nor group");
  return out;
}

// forDevice is the ciphertext of envelope e meant for user/device.
export const forDevice = (e: Envelope, user: string, device: string): EnvelopeTo | undefined =>
  e.to.find((t) => t.user === user && t.device === device);
