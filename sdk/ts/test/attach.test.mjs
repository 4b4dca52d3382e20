import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import { createReadStream, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Readable } from "node:stream";
import { Server } from "./server.mjs";
import { png } from "./png.mjs";
import {
  HashMismatchError, ParleyError, QuotaExceededError, SizeMismatchError, TooManyUploadsError, UploadIncompleteError,
} from "../dist/index.js";

const partBytes = 5 << 20; // the smallest part the server takes
let srv, lim, dir;
before(async () => {
  srv = await Server.start(["--attach.part-bytes", String(partBytes), "--attach.max-file-bytes", String(24 << 20)]);
  // Small limits, to reach them.
  lim = await Server.start(["--attach.max-file-bytes", String(2 << 20), "--attach.user-quota-bytes", String(3 << 20),
    "--attach.uploads-in-flight", "3"]);
  dir = mkdtempSync(join(tmpdir(), "parley-ts-files-"));
});
after(async () => {
  await srv?.close();
  await lim?.close();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

const sha = (b) => createHash("sha256").update(b).digest("hex");
const closeAll = (...cs) => cs.forEach((c) => c.close());

async function pair(a, b, on = srv) {
  const ca = await on.client(a), cb = await on.client(b);
  await Promise.all([ca.log.waitConnected(), cb.log.waitConnected()]);
  const { conv_id } = await ca.openDirect(b);
  return { ca, cb, conv_id };
}

/** A fetch that counts the PUTs it makes, by part number. */
function countingFetch() {
  const puts = [];
  const f = (url, init) => {
    if (init?.method === "PUT") puts.push(Number(/\/parts\/(\d+)/.exec(String(url))?.[1]));
    return fetch(url, init);
  };
  f.puts = puts;
  return f;
}

test("a file message: upload with progress, the receiver's download whole and as a range", async () => {
  const { ca, cb, conv_id } = await pair("pic-a", "pic-b");
  assert.equal(ca.attachmentLimits.maxFileBytes, 24 << 20);
  assert.equal(ca.attachmentLimits.partBytes, partBytes);
  const image = png(640, 480);
  const progress = [];
  const up = await ca.upload(conv_id, new Blob([image], { type: "image/png" }), { name: "sunset.png", onProgress: (p) => progress.push(p) });
  assert.equal(up.state, "complete");
  assert.equal(up.size, image.length);
  assert.equal(up.sha256, sha(image));
  assert.equal(up.parts, 1);
  assert.ok(progress.length >= 2, "progress before and after the part");
  assert.ok(progress.every((p, i) => i === 0 || p.sent >= progress[i - 1].sent), "progress never goes back");
  assert.deepEqual(progress.at(-1), { sent: image.length, total: image.length, part: 1, parts: 1 });

  const ack = await ca.sendFile(conv_id, up.attachment_id, { caption: "the view" });
  await cb.log.waitMessages(conv_id, 1);
  const m = cb.log.messages(conv_id)[0];
  assert.equal(m.kind, "file");
  assert.equal(m.attachment_id, up.attachment_id);
  assert.equal(m.seq, ack.seq);
  const body = JSON.parse(m.body);
  assert.equal(body.name, "sunset.png");
  assert.equal(body.media_type, "image/png");
  assert.equal(body.size, image.length);
  assert.equal(body.sha256, sha(image));
  assert.equal(body.caption, "the view");

  const d = await cb.download(conv_id, m.seq);
  assert.equal(d.status, 200);
  assert.equal(d.contentType, "image/png");
  assert.deepEqual(Buffer.from(await d.bytes()), image);
  assert.throws(() => d.stream(), /read already/);

  const r = await cb.download(conv_id, m.seq, { range: { start: 100, end: 199 } });
  assert.equal(r.status, 206);
  assert.deepEqual(r.range, { start: 100, end: 199, total: image.length });
  assert.deepEqual(Buffer.from(await r.bytes()), image.subarray(100, 200));
  const u = await cb.attachmentUrl(conv_id, m.seq);
  assert.match(u.url, /^http:\/\/127\.0\.0\.1:\d+\//, "an absolute URL, for <img src> or a link");
  assert.ok(u.url_expires_at > Date.now());
  closeAll(ca, cb);
});

test("a picture: its width and height, and the thumbnail (waited for while the server makes it)", async () => {
  const { ca, cb, conv_id } = await pair("thumb-a", "thumb-b");
  const image = png(640, 480);
  const up = await ca.upload(conv_id, new Blob([image], { type: "image/png" }), { name: "sunset.png" });
  assert.equal(up.width, 640);
  assert.equal(up.height, 480);
  const ack = await ca.sendFile(conv_id, up.attachment_id);
  await cb.log.waitMessages(conv_id, 1);
  const body = JSON.parse(cb.log.messages(conv_id)[0].body);
  assert.equal(body.width, 640);
  assert.equal(body.height, 480);
  assert.ok(["pending", "ready"].includes(body.thumbnail), `thumbnail ${body.thumbnail}`);
  const t = await cb.download(conv_id, ack.seq, { thumbnail: true });
  assert.equal(t.contentType, "image/jpeg");
  const jpeg = Buffer.from(await t.bytes());
  assert.deepEqual([...jpeg.subarray(0, 3)], [0xff, 0xd8, 0xff], "a JPEG");
  const u = await cb.attachmentUrl(conv_id, ack.seq, { thumbnail: true });
  assert.equal(u.thumbnail, "ready");
  closeAll(ca, cb);
});

test("several parts from a Node file (reopenable source) and from a one-shot stream; a voice note's duration", async () => {
  const { ca, cb, conv_id } = await pair("parts-a", "parts-b");
  const data = randomBytes(2 * partBytes + 1234);
  const path = join(dir, "big.bin");
  writeFileSync(path, data);
  const src = { size: data.length, open: (start) => createReadStream(path, { start }) };
  const up = await ca.upload(conv_id, src, { name: "big.bin" });
  assert.equal(up.parts, 3);
  assert.equal(up.sha256, sha(data));
  assert.equal(up.media_type, "application/octet-stream");
  await ca.sendFile(conv_id, up.attachment_id);

  // A one-shot stream with its hash known goes up in one pass; without, it
  // is held (its size at most) to be hashed first.
  const voice = randomBytes(partBytes + 7);
  const once = await ca.upload(conv_id, Readable.from([voice.subarray(0, 1000), voice.subarray(1000)]),
    { size: voice.length, sha256: sha(voice), name: "voice.ogg", mediaType: "audio/ogg" });
  assert.equal(once.sha256, sha(voice));
  const held = await ca.upload(conv_id, Readable.from([voice]), { size: voice.length, name: "voice2.ogg", mediaType: "audio/ogg" });
  assert.equal(held.sha256, sha(voice));
  await ca.sendFile(conv_id, once.attachment_id, { durationMs: 3210 });
  await assert.rejects(ca.upload(conv_id, Readable.from([voice]), { size: voice.length + 1, name: "short.ogg" }), SizeMismatchError);

  await cb.log.waitMessages(conv_id, 2);
  const [big, note] = cb.log.messages(conv_id);
  assert.deepEqual(Buffer.from(await (await cb.download(conv_id, big.seq)).bytes()), data);
  assert.equal(JSON.parse(note.body).duration_ms, 3210);
  const d = await cb.download(conv_id, note.seq);
  assert.match(d.contentType, /^audio\/ogg/);
  // The stream form, read chunk by chunk.
  let n = 0;
  for (const rd = d.stream().getReader(); ;) {
    const { done, value } = await rd.read();
    if (done) break;
    n += value.length;
  }
  assert.equal(n, voice.length);
  closeAll(ca, cb);
});

test("resume: an upload aborted after two parts is finished by a new client from part 3", async () => {
  const { ca, cb, conv_id } = await pair("res-a", "res-b");
  const data = randomBytes(4 * partBytes);
  const blob = new Blob([data]);
  const ctl = new AbortController();
  const f1 = countingFetch();
  const c1 = await srv.client("res-a", "d1", { fetch: f1 });
  await c1.log.waitConnected();
  let id = "";
  await assert.rejects(c1.upload(conv_id, blob, {
    name: "resumed.bin", signal: ctl.signal, onCreate: (u) => { id = u.attachment_id; },
    onProgress: (p) => { if (p.part === 2) ctl.abort("enough"); },
  }), (e) => e instanceof ParleyError && e.code === "aborted");
  assert.deepEqual(f1.puts, [1, 2]);
  c1.close();
  // The client restarted: it knows the attachment id (kept by the app from onCreate) and the file.
  assert.ok(id, "onCreate named the upload");
  const f2 = countingFetch();
  const c2 = await srv.client("res-a", "d2", { fetch: f2 });
  await c2.log.waitConnected();
  await assert.rejects(c2.sendFile(conv_id, id), UploadIncompleteError);
  const progress = [];
  const done = await c2.resume(id, blob, { onProgress: (p) => progress.push(p.part) });
  assert.equal(done.state, "complete");
  assert.deepEqual(f2.puts, [3, 4], "only the parts the server did not have");
  assert.equal(progress[0], 2);
  await assert.rejects(c2.resume(id, new Blob([data.subarray(1)])), SizeMismatchError);
  await c2.sendFile(conv_id, id);
  await cb.log.waitMessages(conv_id, 1);
  assert.deepEqual(Buffer.from(await (await cb.download(conv_id, cb.log.messages(conv_id)[0].seq)).bytes()), data);
  closeAll(ca, cb, c2);
});

test("lies and limits: a wrong hash deletes the upload, too large, too many in flight, the quota", async () => {
  const { ca, cb, conv_id } = await pair("lim-a", "lim-b", lim);
  const data = randomBytes(1 << 20);
  let lie = "";
  await assert.rejects(ca.upload(conv_id, data, { name: "lie.bin", sha256: sha(randomBytes(8)), onCreate: (u) => { lie = u.attachment_id; } }), HashMismatchError);
  await assert.rejects(ca.sendFile(conv_id, lie), (e) => e.code === "not_found", "nothing half-visible: the upload is gone");
  await assert.rejects(ca.upload(conv_id, new Uint8Array((2 << 20) + 1), { name: "huge.bin" }), (e) => e.code === "too_large");
  // Three uploads may be in flight; a fourth is refused.
  const held = [];
  for (let i = 0; i < 3; i++) {
    const r = await ca.request({ type: "upload_create", conv_id, size: 10, sha256: sha(Buffer.alloc(10)), media_type: "text/plain", name: `f${i}.txt` });
    held.push(r.upload.attachment_id);
  }
  await assert.rejects(ca.upload(conv_id, Buffer.alloc(10), { name: "fourth.txt" }), TooManyUploadsError);
  for (const id of held) await ca.resume(id, Buffer.alloc(10));
  // 3 MiB of quota: 30 bytes are stored, 2 MiB more fit, then 1 MiB does not.
  await ca.upload(conv_id, new Uint8Array(2 << 20), { name: "q1.bin" });
  await assert.rejects(ca.upload(conv_id, new Uint8Array(1 << 20), { name: "q2.bin" }), QuotaExceededError);
  // Another user's quota is theirs.
  await cb.upload(conv_id, new Uint8Array(1 << 20), { name: "q3.bin" });
  closeAll(ca, cb);
});

test("the HTTP fallback: upload, file message and download over /v1/rpc", async () => {
  const a = await srv.client("http-a", "d1", { transport: "http" }), b = await srv.client("http-b", "d1", { transport: "http" });
  await Promise.all([a.log.waitConnected(), b.log.waitConnected()]);
  const { conv_id } = await a.openDirect("http-b");
  const text = new TextEncoder().encode("hello over http\n");
  const up = await a.upload(conv_id, text, { name: "note.txt", mediaType: "text/plain" });
  await a.sendFile(conv_id, up.attachment_id);
  await b.log.waitMessages(conv_id, 1);
  const d = await b.download(conv_id, b.log.messages(conv_id)[0].seq);
  assert.equal(new TextDecoder().decode(await d.bytes()), "hello over http\n");
  assert.match(d.contentType, /^text\/plain; charset=utf-8/);
  closeAll(a, b);
});

test("the window: a non-member gets not_member, a recalled file forbidden", async () => {
  const { ca, cb, conv_id } = await pair("win-a", "win-b");
  const out = await srv.client("win-out");
  await out.log.waitConnected();
  const up = await ca.upload(conv_id, Buffer.from("secret"), { name: "s.txt", mediaType: "text/plain" });
  const ack = await ca.sendFile(conv_id, up.attachment_id);
  await assert.rejects(out.download(conv_id, ack.seq), (e) => e.code === "not_member");
  await assert.rejects(out.upload(conv_id, Buffer.from("x"), { name: "x.txt" }), (e) => e.code === "not_member");
  await ca.recall(conv_id, ack.seq);
  await assert.rejects(cb.download(conv_id, ack.seq), (e) => e.code === "forbidden");
  closeAll(ca, cb, out);
});
