// Attachments (docs/protocol.md, "Attachments"): upload in parts with
// progress and resume, the file message, downloads and download URLs. The
// Client's upload, resume, sendFile, download and attachmentUrl methods are
// these functions bound to its connection.
import { HashMismatchError, ParleyError, PartOutOfOrderError, SizeMismatchError, parleyError } from "./errors.js";
import { Sha256, toHex } from "./sha256.js";

/** Where an upload stands (the upload field of an upload answer). */
export interface UploadInfo {
  attachment_id: string;
  conv_id: string;
  size: number;
  /** Lowercase hex SHA-256 of the bytes uploaded. */
  sha256: string;
  media_type: string;
  name: string;
  state: "uploading" | "complete" | "attached";
  /** Size of every part but the last. */
  part_size: number;
  /** Number of parts (1 for an empty file). */
  parts: number;
  /** Parts 1..received arrived; the next one to send is received+1. */
  received: number;
  /** Unix ms: deleted then unless complete and named by a message. */
  expires_at?: number;
  /** "parley" (the server's own endpoint) or "s3" (a presigned URL). */
  target: string;
  part?: number;
  url?: string;
  url_expires_at?: number;
  width?: number;
  height?: number;
  /** "pending", "ready", "none" or "refused". */
  thumbnail?: string;
}

/** A file's record and a short-lived URL for it (the attachment field of an attachment answer). */
export interface AttachmentInfo {
  attachment_id: string;
  conv_id: string;
  seq: number;
  size: number;
  sha256: string;
  media_type: string;
  name: string;
  width?: number;
  height?: number;
  thumbnail?: string;
  /** GET, Range requests work. Absolute: a relative URL from the server is resolved against its HTTP origin. */
  url: string;
  url_expires_at: number;
}

/** The body of a kind "file" message in a plain conversation (JSON). */
export interface FileBody {
  attachment_id: string;
  name: string;
  size: number;
  media_type: string;
  sha256: string;
  width?: number;
  height?: number;
  duration_ms?: number;
  thumbnail?: string;
  caption?: string;
}

/**
 * Bytes that can be opened again from any offset: what a Node file is
 * (`{ size, open: (start) => fs.createReadStream(path, { start }) }`).
 * Hashing reads it once, the upload once more, a resume from where the
 * server stands.
 */
export interface UploadSource {
  size: number;
  open(start: number): ReadableStream<Uint8Array> | AsyncIterable<Uint8Array>;
}

/**
 * What upload takes: a Blob or File, bytes, a reopenable source, or a
 * one-shot stream (a web ReadableStream, a Node Readable or any async
 * iterable of bytes) whose size is given in the options. The SHA-256 must
 * be known before the first byte goes up: a one-shot stream without
 * options.sha256 is read into memory first (at most its size).
 */
export type UploadData = Blob | Uint8Array | ArrayBuffer | UploadSource | ReadableStream<Uint8Array> | AsyncIterable<Uint8Array>;

export interface UploadProgress {
  /** Bytes the server has (parts acknowledged plus the one in flight, as far as known). */
  sent: number;
  total: number;
  /** Parts acknowledged, of parts. */
  part: number;
  parts: number;
}

export interface UploadOptions {
  /** The file name (1–255 bytes, no / or \); default the File's name, else "file". */
  name?: string;
  /** type/subtype; default the Blob's type, else application/octet-stream. */
  mediaType?: string;
  /** Byte count of a one-shot stream (required for one). */
  size?: number;
  /** Lowercase hex SHA-256, when the caller knows it (then nothing is hashed). */
  sha256?: string;
  onProgress?: (p: UploadProgress) => void;
  /** Called once the server made the record: keep its attachment_id to resume() after a restart. */
  onCreate?: (u: UploadInfo) => void;
  /** Aborts between and during parts; the upload can be resumed later. */
  signal?: AbortSignal;
}

export interface ResumeOptions {
  onProgress?: (p: UploadProgress) => void;
  signal?: AbortSignal;
  /** Byte count of a one-shot stream. */
  size?: number;
}

export interface SendFileOptions {
  caption?: string;
  /** Length of a voice note, audio or video. */
  durationMs?: number;
  /** Of a video (the server reads an image's own). */
  width?: number;
  height?: number;
  /** Reuse a client_msg_id (retrying a send across page loads). */
  clientMsgId?: string;
}

export interface DownloadOptions {
  /** The thumbnail (JPEG) instead of the file. */
  thumbnail?: boolean;
  /** Bytes start..end inclusive (end omitted: to the end). */
  range?: { start: number; end?: number };
  signal?: AbortSignal;
}

/** A download under way: read its body once, as a stream, bytes or a Blob. */
export interface Download {
  info: AttachmentInfo;
  /** 200, or 206 for a range. */
  status: number;
  /** The Content-Type the server served (application/octet-stream for anything but the safe types). */
  contentType: string;
  /** Of a 206: the bytes served and the file's size. */
  range?: { start: number; end: number; total: number };
  /**
   * The body. A whole file (not a range, not a thumbnail) is checked against
   * info.sha256 as it is read: the stream errors (bytes and blob reject)
   * with HashMismatchError on different bytes.
   */
  stream(): ReadableStream<Uint8Array>;
  bytes(): Promise<Uint8Array>;
  /** Typed with the served Content-Type, never the declared media type, so that a blob: URL of it cannot run script in the page's origin. */
  blob(): Promise<Blob>;
}

/** What the attachment functions need of a Client. */
export interface AttachConn {
  request(f: Record<string, unknown>, retry?: boolean, attempts?: number): Promise<{ type: string }>;
  fetch: typeof fetch;
  /** http(s)://host:port of the server. */
  httpBase: string;
  /** PUT with XMLHttpRequest where there is one (no fetch was injected): it reports upload progress. */
  xhr: boolean;
}

const wholeHashMax = 8 << 20; // larger Blobs are hashed a slice at a time
const sliceBytes = 4 << 20;
const putAttempts = 6;

/** Resolves a URL the server gave (relative to its HTTP origin, or absolute). */
export function resolveURL(httpBase: string, url: string): string {
  return new URL(url, httpBase + "/").toString();
}

export async function upload(c: AttachConn, convId: string, data: UploadData, o: UploadOptions = {}): Promise<UploadInfo> {
  const body = await bodyOf(data, o.size, o.sha256 !== undefined);
  const name = o.name ?? (typeof File !== "undefined" && data instanceof File && data.name ? data.name : "file");
  const mediaType = o.mediaType ?? (data instanceof Blob && data.type ? data.type : "application/octet-stream");
  const sha256 = o.sha256 ?? (await body.hash(o.signal));
  aborted(o.signal);
  const created = await uploadFrame(c, { type: "upload_create", conv_id: convId, size: body.size, sha256, media_type: mediaType, name });
  o.onCreate?.(created);
  return finish(c, created, body, o);
}

export async function resume(c: AttachConn, attachmentId: string, data: UploadData, o: ResumeOptions = {}): Promise<UploadInfo> {
  const body = await bodyOf(data, o.size, true);
  const info = await uploadFrame(c, { type: "upload_status", attachment_id: attachmentId });
  if (info.size !== body.size) {
    throw new SizeMismatchError("size_mismatch", `upload ${attachmentId} is of ${info.size} bytes, these are ${body.size}`);
  }
  return finish(c, info, body, o);
}

async function finish(c: AttachConn, info: UploadInfo, body: Body, o: ResumeOptions): Promise<UploadInfo> {
  if (info.state !== "uploading") return info;
  const progress = (part: number, inFlight: number) =>
    o.onProgress?.({ sent: Math.min(body.size, part * info.part_size + inFlight), total: body.size, part, parts: info.parts });
  let received = info.received;
  let stalls = 0;
  progress(received, 0);
  while (received < info.parts) {
    aborted(o.signal);
    const n = received + 1;
    const start = (n - 1) * info.part_size;
    const bytes = await body.part(start, Math.min(info.part_size, body.size - start));
    received = await sendPart(c, info, n, bytes, (sent) => progress(received, sent), o.signal);
    // A server that keeps answering fewer parts than were sent is not
    // taking them: give up rather than loop.
    if (received < n && ++stalls >= putAttempts) {
      throw new PartOutOfOrderError("part_out_of_order", `part ${n}: the server stays at ${received} parts`, 0, received);
    }
    progress(received, 0);
  }
  aborted(o.signal);
  return uploadFrame(c, { type: "upload_complete", attachment_id: info.attachment_id });
}

/** Puts part n; answers how many parts the server has then (n, or more or fewer when it says so). */
async function sendPart(c: AttachConn, info: UploadInfo, n: number, bytes: Blob | Uint8Array, onBytes: (sent: number) => void, signal?: AbortSignal): Promise<number> {
  let last: unknown;
  for (let attempt = 0; attempt < putAttempts; attempt++) {
    if (attempt > 0) await sleep(Math.min(8000, 250 * 2 ** attempt), signal);
    let p: UploadInfo;
    try {
      p = await uploadFrame(c, { type: "upload_part", attachment_id: info.attachment_id, part: n });
    } catch (e) {
      if (e instanceof PartOutOfOrderError) {
        // The server has fewer (or more) parts than this client thought: ask where it stands.
        return (await uploadFrame(c, { type: "upload_status", attachment_id: info.attachment_id })).received;
      }
      throw e;
    }
    let r: { status: number; text: string };
    try {
      r = await put(c, resolveURL(c.httpBase, p.url!), bytes, onBytes, signal);
    } catch (e) {
      if (signal?.aborted) throw abortError(signal);
      last = e; // the network: try again with a fresh URL
      continue;
    }
    if (r.status >= 200 && r.status < 300) {
      if (p.target !== "parley") return n; // S3 answers an ETag, not a count
      const j = parseJSON(r.text);
      return typeof j?.received === "number" ? j.received : n;
    }
    const j = parseJSON(r.text);
    const code = typeof j?.code === "string" ? j.code : `http_${r.status}`;
    const msg = typeof j?.error === "string" ? j.error : r.text.slice(0, 200);
    if (code === "part_out_of_order" && typeof j?.received === "number") return j.received;
    last = parleyError(code, `PUT part ${n}: ${msg}`);
    // An expired or refused signature (the URL outlived url_ttl), the same
    // part still being received from an attempt that failed on this side
    // (409 conflict), or a server-side failure: again, with a fresh URL.
    // Anything else is the client's fault.
    if (r.status === 401 || r.status === 403 || r.status === 408 || code === "conflict" || r.status === 429 || r.status >= 500) continue;
    throw last;
  }
  throw last instanceof ParleyError ? last : new ParleyError("connection_lost", `PUT part ${n}: ${last}`);
}

async function uploadFrame(c: AttachConn, f: Record<string, unknown>): Promise<UploadInfo> {
  // upload_create is not retried: a lost answer would leave a second
  // record counting against the quota until it expires.
  const r = (await c.request(f, f.type !== "upload_create")) as unknown as { upload: UploadInfo };
  return r.upload;
}

export function sendFileFrame(convId: string, attachmentId: string, o: SendFileOptions, clientMsgId: string): Record<string, unknown> {
  const meta: Record<string, unknown> = {};
  if (o.caption) meta.caption = o.caption;
  if (o.durationMs) meta.duration_ms = Math.round(o.durationMs);
  if (o.width) meta.width = o.width;
  if (o.height) meta.height = o.height;
  const f: Record<string, unknown> = { type: "send", conv_id: convId, client_msg_id: clientMsgId, kind: "file", attachment_id: attachmentId };
  if (Object.keys(meta).length) f.body = JSON.stringify(meta);
  return f;
}

export async function attachmentUrl(c: AttachConn, convId: string, seq: number, o: { thumbnail?: boolean } = {}): Promise<AttachmentInfo> {
  const f: Record<string, unknown> = { type: "attachment_url", conv_id: convId, seq };
  if (o.thumbnail) f.thumbnail = true;
  // A thumbnail still being made answers not_ready (retryable): the retries
  // wait its retry_after_ms, for a few seconds at most.
  const r = (await c.request(f, true, 20)) as unknown as { attachment: AttachmentInfo };
  return { ...r.attachment, url: resolveURL(c.httpBase, r.attachment.url) };
}

export async function download(c: AttachConn, convId: string, seq: number, o: DownloadOptions = {}): Promise<Download> {
  const info = await attachmentUrl(c, convId, seq, { thumbnail: o.thumbnail });
  const headers: Record<string, string> = {};
  if (o.range) headers.Range = `bytes=${o.range.start}-${o.range.end ?? ""}`;
  const resp = await c.fetch(info.url, { headers, signal: o.signal });
  if (!resp.ok) {
    const text = await resp.text();
    const j = parseJSON(text);
    throw parleyError(typeof j?.code === "string" ? j.code : `http_${resp.status}`, typeof j?.error === "string" ? j.error : `GET ${resp.status}`);
  }
  const contentType = resp.headers.get("Content-Type") ?? "application/octet-stream";
  let range: Download["range"];
  const cr = /^bytes (\d+)-(\d+)\/(\d+)$/.exec(resp.headers.get("Content-Range") ?? "");
  if (resp.status === 206 && cr) range = { start: Number(cr[1]), end: Number(cr[2]), total: Number(cr[3]) };
  const check = !o.thumbnail && !o.range;
  let used = false;
  const stream = (): ReadableStream<Uint8Array> => {
    if (used) throw new Error("download: the body is read already");
    used = true;
    const src = resp.body ?? new ReadableStream<Uint8Array>({ start: (ctl) => ctl.close() });
    return check ? src.pipeThrough(hashCheck(info.sha256, info.size)) : src;
  };
  const bytes = async () => readAll(stream());
  const blob = async () => new Blob([await bytes() as Uint8Array<ArrayBuffer>], { type: contentType });
  return { info, status: resp.status, contentType, range, stream, bytes, blob };
}

function hashCheck(want: string, size: number): TransformStream<Uint8Array, Uint8Array> {
  const h = new Sha256();
  let n = 0;
  return new TransformStream({
    transform(chunk, ctl) {
      h.update(chunk);
      n += chunk.length;
      ctl.enqueue(chunk);
    },
    flush(ctl) {
      const got = h.hex();
      if (n !== size) ctl.error(new SizeMismatchError("size_mismatch", `downloaded ${n} bytes, the file has ${size}`));
      else if (got !== want) ctl.error(new HashMismatchError("hash_mismatch", `downloaded bytes hash to ${got}, the file's SHA-256 is ${want}`));
    },
  });
}

async function readAll(s: ReadableStream<Uint8Array>): Promise<Uint8Array> {
  const parts: Uint8Array[] = [];
  let n = 0;
  for (const r = s.getReader(); ;) {
    const { done, value } = await r.read();
    if (done) break;
    parts.push(value);
    n += value.length;
  }
  const out = new Uint8Array(n);
  let off = 0;
  for (const p of parts) { out.set(p, off); off += p.length; }
  return out;
}

// --- the bytes to upload ------------------------------------------------

interface Body {
  size: number;
  hash(signal?: AbortSignal): Promise<string>;
  /** len bytes from start (starts only grow, except for random-access bodies). */
  part(start: number, len: number): Promise<Blob | Uint8Array>;
}

/** hashKnown: the stream need not be hashed (so it need not be held whole). */
async function bodyOf(data: UploadData, size: number | undefined, hashKnown: boolean): Promise<Body> {
  if (data instanceof Blob) return blobBody(data);
  if (data instanceof ArrayBuffer) return bytesBody(new Uint8Array(data));
  if (data instanceof Uint8Array) return bytesBody(data);
  if (isSource(data)) return sourceBody(data);
  if (size === undefined || !Number.isSafeInteger(size) || size < 0) {
    throw new ParleyError("invalid_argument", "a stream needs its size in the options");
  }
  const cur = new Cursor(iterate(data));
  if (hashKnown) return streamBody(cur, size);
  // The hash comes first, and a one-shot stream cannot be read twice.
  const all = await cur.read(size);
  if (all.length !== size || !(await cur.atEnd())) {
    throw new SizeMismatchError("size_mismatch", `the stream is not of the ${size} bytes given`);
  }
  return bytesBody(all);
}

function isSource(d: unknown): d is UploadSource {
  return typeof d === "object" && d !== null && typeof (d as UploadSource).open === "function" && typeof (d as UploadSource).size === "number";
}

function blobBody(b: Blob): Body {
  return {
    size: b.size,
    async hash(signal) {
      const subtle = globalThis.crypto?.subtle;
      if (subtle && b.size <= wholeHashMax) return toHex(new Uint8Array(await subtle.digest("SHA-256", await b.arrayBuffer())));
      const h = new Sha256();
      for (let off = 0; off < b.size; off += sliceBytes) {
        aborted(signal);
        h.update(new Uint8Array(await b.slice(off, off + sliceBytes).arrayBuffer()));
      }
      return h.hex();
    },
    async part(start, len) { return b.slice(start, start + len); },
  };
}

function bytesBody(u: Uint8Array): Body {
  return {
    size: u.length,
    async hash() {
      const subtle = globalThis.crypto?.subtle;
      if (subtle) return toHex(new Uint8Array(await subtle.digest("SHA-256", u as Uint8Array<ArrayBuffer>)));
      return new Sha256().update(u).hex();
    },
    async part(start, len) { return u.subarray(start, start + len); },
  };
}

function sourceBody(s: UploadSource): Body {
  let cur: Cursor | null = null;
  return {
    size: s.size,
    async hash(signal) {
      const h = new Sha256();
      const c = new Cursor(iterate(s.open(0)));
      let n = 0;
      for (;;) {
        aborted(signal);
        const chunk = await c.next();
        if (!chunk) break;
        h.update(chunk);
        n += chunk.length;
      }
      if (n !== s.size) throw new SizeMismatchError("size_mismatch", `the source gave ${n} bytes, its size says ${s.size}`);
      return h.hex();
    },
    async part(start, len) {
      if (!cur || cur.pos > start) {
        await cur?.close();
        cur = new Cursor(iterate(s.open(start)), start);
      }
      await cur.skip(start - cur.pos);
      const b = await cur.read(len);
      if (b.length !== len) throw new SizeMismatchError("size_mismatch", `the source ended at ${start + b.length}, its size says ${s.size}`);
      return b;
    },
  };
}

function streamBody(cur: Cursor, size: number): Body {
  return {
    size,
    async hash() { throw new Error("unreachable: a stream is uploaded with a known hash"); },
    async part(start, len) {
      if (cur.pos > start) throw new ParleyError("invalid_argument", `the server needs bytes from ${start} again; a one-shot stream cannot go back (resume with a fresh stream)`);
      await cur.skip(start - cur.pos);
      const b = await cur.read(len);
      if (b.length !== len) throw new SizeMismatchError("size_mismatch", `the stream ended at ${start + b.length}, its size is ${size}`);
      return b;
    },
  };
}

function iterate(s: ReadableStream<Uint8Array> | AsyncIterable<Uint8Array>): AsyncIterator<Uint8Array> {
  if (typeof (s as ReadableStream).getReader === "function") {
    const r = (s as ReadableStream<Uint8Array>).getReader();
    return {
      next: () => r.read() as Promise<IteratorResult<Uint8Array>>,
      return: async () => { await r.cancel(); return { done: true, value: undefined }; },
    };
  }
  return (s as AsyncIterable<Uint8Array>)[Symbol.asyncIterator]();
}

/** Reads exact byte counts from an iterator of chunks of any size. */
class Cursor {
  private rest: Uint8Array | null = null;
  private ended = false;
  constructor(private readonly it: AsyncIterator<Uint8Array>, public pos = 0) {}

  async next(): Promise<Uint8Array | null> {
    if (this.rest) {
      const r = this.rest;
      this.rest = null;
      this.pos += r.length;
      return r;
    }
    while (!this.ended) {
      const { done, value } = await this.it.next();
      if (done) { this.ended = true; break; }
      const chunk = typeof value === "string" ? new TextEncoder().encode(value) : value;
      if (chunk.length === 0) continue;
      this.pos += chunk.length;
      return chunk;
    }
    return null;
  }

  private unread(b: Uint8Array) {
    if (b.length === 0) return;
    this.rest = b;
    this.pos -= b.length;
  }

  /** n bytes, fewer only at the end. */
  async read(n: number): Promise<Uint8Array> {
    const out = new Uint8Array(n);
    let off = 0;
    while (off < n) {
      const c = await this.next();
      if (!c) return out.subarray(0, off);
      const take = Math.min(c.length, n - off);
      out.set(c.subarray(0, take), off);
      off += take;
      this.unread(c.subarray(take));
    }
    return out;
  }

  async skip(n: number): Promise<void> {
    while (n > 0) {
      const c = await this.next();
      if (!c) return;
      const take = Math.min(c.length, n);
      n -= take;
      this.unread(c.subarray(take));
    }
  }

  async atEnd(): Promise<boolean> {
    const c = await this.next();
    if (!c) return true;
    this.unread(c);
    return false;
  }

  async close(): Promise<void> {
    try { await this.it.return?.(); } catch { /* already ended */ }
  }
}

// --- the PUT --------------------------------------------------------------

/**
 * PUTs a part. In a browser, XMLHttpRequest reports upload progress (fetch
 * cannot); elsewhere fetch. Network failures reject; HTTP statuses resolve.
 */
function put(c: AttachConn, url: string, body: Blob | Uint8Array, onBytes: (sent: number) => void, signal?: AbortSignal): Promise<{ status: number; text: string }> {
  const XHR = (globalThis as { XMLHttpRequest?: typeof XMLHttpRequest }).XMLHttpRequest;
  if (XHR && c.xhr) {
    return new Promise((resolve, reject) => {
      const x = new XHR();
      x.open("PUT", url);
      x.upload.onprogress = (ev) => onBytes(ev.loaded);
      x.onload = () => resolve({ status: x.status, text: x.responseText });
      x.onerror = () => reject(new Error("network error"));
      x.onabort = () => reject(abortError(signal));
      signal?.addEventListener("abort", () => x.abort(), { once: true });
      x.send(body as XMLHttpRequestBodyInit);
    });
  }
  return c.fetch(url, { method: "PUT", body: body as BodyInit, signal }).then(async (r) => ({ status: r.status, text: await r.text() }));
}

function parseJSON(s: string): Record<string, unknown> | null {
  try {
    const v = JSON.parse(s);
    return typeof v === "object" && v !== null ? v : null;
  } catch {
    return null;
  }
}

function abortError(signal?: AbortSignal): ParleyError {
  return new ParleyError("aborted", String(signal?.reason ?? "aborted"));
}

function aborted(signal?: AbortSignal) {
  if (signal?.aborted) throw abortError(signal);
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((res, rej) => {
    const t = setTimeout(res, ms);
    signal?.addEventListener("abort", () => { clearTimeout(t); rej(abortError(signal)); }, { once: true });
  });
}
