import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { createECDH, generateKeyPairSync, randomBytes } from "node:crypto";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Server } from "./server.mjs";
import { ParleyError } from "../dist/index.js";

// The VAPID key a server signs Web Push with, and its public key as hello
// should announce it (computed here from the JWK, not by the server's code).
const vapid = generateKeyPairSync("ec", { namedCurve: "prime256v1" });
const jwk = vapid.publicKey.export({ format: "jwk" });
const wantKey = Buffer.concat([Buffer.of(4), Buffer.from(jwk.x, "base64url"), Buffer.from(jwk.y, "base64url")]).toString("base64url");

let srv, plain;
before(async () => {
  const dir = mkdtempSync(join(tmpdir(), "parley-ts-vapid-"));
  const file = join(dir, "vapid.pem");
  writeFileSync(file, vapid.privateKey.export({ format: "pem", type: "pkcs8" }), { mode: 0o600 });
  [srv, plain] = await Promise.all([
    Server.start(["--push.webpush.vapid-key-file", file, "--push.webpush.subject", "mailto:ops@parley.example"]),
    Server.start(),
  ]);
});
after(async () => { await Promise.all([srv?.close(), plain?.close()]); });

/** A browser's subscription as PushSubscription.toJSON() gives it. */
function subscription(endpoint) {
  const ua = createECDH("prime256v1");
  ua.generateKeys();
  return { endpoint, keys: { p256dh: ua.getPublicKey().toString("base64url"), auth: randomBytes(16).toString("base64url") } };
}

test("webPushKey is the server's VAPID public key, null without Web Push", async () => {
  const a = await srv.client("pk1", "web-1"), b = await plain.client("pk1", "web-1");
  await Promise.all([a.log.waitConnected(), b.log.waitConnected()]);
  assert.equal(a.webPushKey, wantKey);
  assert.equal(b.webPushKey, null);
  a.close(); b.close();
});

test("pushRegister and pushRemove: a Web Push subscription is stored on this device, a bad one refused", async () => {
  const a = await srv.client("pr1", "web-1");
  await a.log.waitConnected();
  const s = subscription("https://push.example.net/send/abc");
  const regs = await a.pushRegister({ provider: "webpush", endpoint: s.endpoint, p256dh: s.keys.p256dh, auth: s.keys.auth });
  assert.deepEqual(regs.map((r) => [r.provider, r.endpoint, r.p256dh, r.auth]), [["webpush", s.endpoint, s.keys.p256dh, s.keys.auth]]);
  assert.ok(regs[0].updated_at > 0);
  // Registering it again refreshes it (one registration, the new keys).
  const s2 = subscription(s.endpoint);
  const again = await a.pushRegister({ provider: "webpush", endpoint: s.endpoint, p256dh: s2.keys.p256dh, auth: s2.keys.auth });
  assert.deepEqual(again.map((r) => r.p256dh), [s2.keys.p256dh]);
  await assert.rejects(a.pushRegister({ provider: "webpush", endpoint: "http://push.example.net/x", p256dh: s.keys.p256dh, auth: s.keys.auth }),
    (e) => e instanceof ParleyError && e.code === "invalid_argument");
  await assert.rejects(a.pushRegister({ provider: "webpush", endpoint: s.endpoint, p256dh: s.keys.p256dh, auth: "AAAA" }),
    (e) => e instanceof ParleyError && e.code === "invalid_argument");
  assert.deepEqual(await a.pushRemove({ provider: "webpush", endpoint: s.endpoint }), []);
  await a.pushRegister({ provider: "fcm", token: "fcm-token:APA91b" });
  assert.deepEqual(await a.pushRemove(), [], "without a registration named, every one of the device goes");
  a.close();
});
