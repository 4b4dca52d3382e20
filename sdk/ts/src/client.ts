import { Backoff } from "./backoff.js";
import type {
  ConvInfo, ConvSnapshot, ConvSummary, Hello, Message, PresenceState, Reaction, SAck, SConv, SConvList, SError, SHistory,
  Position, PushRegistration, ReadBy, SPresence, SPush, SReactions, SReadBy, SReceipt, SSearch, SSnapshot, SearchQuery, SearchResult, ServerFrame, SyncConv,
  DND, SDnd, SConvMute,
} from "./frames.js";
import { ConvOrder } from "./order.js";
import { ParleyError, parleyError } from "./errors.js";
import {
  attachmentUrl, download, resume, sendFileFrame, upload,
  type AttachConn, type AttachmentInfo, type Download, type DownloadOptions, type ResumeOptions, type SendFileOptions,
  type UploadData, type UploadInfo, type UploadOptions,
} from "./attach.js";
import { HandshakeError, openPoll, openWebSocket, type CloseInfo, type Transport, type WebSocketCtor } from "./transport.js";

/** Persists, per conversation, the highest seq handed to the application. */
export interface PositionStore {
  load(): Record<string, number>;
  save(convId: string, seq: number): void;
}

/** In-memory positions (the default). */
export class MemoryPositions implements PositionStore {
  private pos: Record<string, number> = {};
  load() { return { ...this.pos }; }
  save(convId: string, seq: number) { if (seq > (this.pos[convId] ?? 0)) this.pos[convId] = seq; }
}

/** Positions in a Web Storage (localStorage) under one key. */
export class StoragePositions implements PositionStore {
  constructor(private readonly storage: Storage, private readonly key: string) {}
  load(): Record<string, number> {
    try { return JSON.parse(this.storage.getItem(this.key) ?? "{}"); } catch { return {}; }
  }
  save(convId: string, seq: number) {
    const p = this.load();
    if (seq > (p[convId] ?? 0)) {
      p[convId] = seq;
      this.storage.setItem(this.key, JSON.stringify(p));
    }
  }
}

export interface ClientOptions {
  /** The server's base URL: http(s)://host:port (or ws(s)://). */
  url: string;
  /** A bearer token, or a function called before every connection attempt. */
  token: string | (() => string | Promise<string>);
  /** This device's id (1–64 bytes of [A-Za-z0-9._@-]). */
  device: string;
  /** WebSocket constructor; default globalThis.WebSocket (Node 20: pass the ws package's). */
  WebSocket?: WebSocketCtor;
  /** fetch; default globalThis.fetch. */
  fetch?: typeof fetch;
  /** "auto" (WebSocket, HTTP fallback when it cannot open), "websocket" or "http". */
  transport?: "auto" | "websocket" | "http";
  /** Reconnect backoff bounds (full jitter). Defaults 250 ms and 30 s. */
  minBackoffMs?: number;
  maxBackoffMs?: number;
  /** Bound on one request attempt and on the handshake. Default 10 s. */
  requestTimeoutMs?: number;
  /** Where positions persist; default in memory. */
  positions?: PositionStore;
  /** Uniform random in [0,1); injected by tests. */
  random?: () => number;
}

/** The mute_until of a conversation muted until it is unmuted (9999-12-31T23:59:59.999Z). */
export const MUTE_FOREVER = 253402300799999;

export interface Receipt { conv_id: string; user_id: string; device_id?: string; seq: number; state: "delivered" | "read" }

/** The events a Client emits and their payloads. */
export interface ClientEvents {
  /** The next message (text, edit, recall, system, state) of its conversation, in seq order, once. */
  message: { convId: string; message: Message };
  /** A conversation in the (re)connect sync, before its messages; skipped > 0 when older ones were jumped. */
  snapshot: { convId: string; snapshot: ConvSnapshot; skipped: number };
  receipt: Receipt;
  typing: { convId: string; userId: string };
  presence: PresenceState[];
  /** This user muted (muteUntil; MUTE_FOREVER: until unmuted) or unmuted (undefined) a conversation's notifications, on any device. */
  mute: { convId: string; muteUntil?: number };
  /** This user's do-not-disturb changed, on any device. */
  dnd: DND;
  /** A connection is up and its sync applied. */
  connected: { hello: Hello; transport: "websocket" | "http" };
  /**
   * The connection ended; the client reconnects unless it is stopped. code
   * is the close code when one came (on the HTTP fallback, 4001/4002/4003
   * stand for a poll refused as token_expired/token_revoked/banned).
   */
  disconnected: { reason: string; code?: number };
  /**
   * The node asked this connection to move (goaway: it is draining for a
   * restart); the client keeps using it until it closes, then reconnects
   * no sooner than retryAfterMs.
   */
  draining: { retryAfterMs: number };
  /** The next attempt starts at `at` (Unix ms), in `delayMs`. */
  reconnecting: { delayMs: number; at: number; attempt: number };
  /**
   * The client stopped for good: a refused token (a fixed one, or a token
   * function that returned the token the server just closed the connection
   * for: error.code token_expired / token_revoked), a banned user
   * (error.code banned), replaced by the same device, a protocol error, or
   * close().
   */
  stopped: { reason: string; error?: ParleyError };
}

type Listener<T> = (payload: T) => void;
type Pending = { resolve: (f: ServerFrame) => void; reject: (e: ParleyError) => void; timer: ReturnType<typeof setTimeout> };

export interface SendOptions {
  kind?: "text" | "state";
  coalesceKey?: string;
  mentions?: string[];
  mentionAll?: boolean;
  /** The seq of an earlier message of the conversation this one answers (not with kind state). */
  replyTo?: number;
  /** Reuse a client_msg_id (retrying a send across page loads). */
  clientMsgId?: string;
}

/** The answer to send, edit and recall: the message is stored. */
export interface Ack { conv_id: string; client_msg_id: string; seq: number; msg_id: string; server_time: number; duplicate?: boolean }

export function newClientMsgId(): string {
  const c = (globalThis as { crypto?: { randomUUID?: () => string } }).crypto;
  if (c?.randomUUID) return c.randomUUID();
  return `${Date.now().toString(36)}-${Math.random().toString(36).slice(2)}`;
}

/** Acknowledgements of direct conversations and small groups (pushes
 * without an ack policy) wait at most this long: delivered receipts. */
const deliveredDelayMs = 100;
/** Acknowledgements of medium groups' pushes (ack "batch") may wait this
 * long: one delivered frame with positions then covers every conversation
 * handed over meanwhile. A large group's (ack "none") are never sent; its
 * positions are saved on the same slow timer. */
const batchDelayMs = 1000;

/**
 * Client keeps one connection to a Parley server alive and turns its push
 * stream into an ordered, gap-free, duplicate-free stream of events per
 * conversation, with the same behaviour as the Go SDK (client/): jittered
 * reconnects honouring retry_after_ms, Retry-After and goaway; one sync on
 * every (re)connect before any push is handed over; gap fill from history;
 * cumulative delivered acknowledgements; sends retried with one
 * client_msg_id until stored.
 */
export class Client {
  private readonly o: Required<Omit<ClientOptions, "WebSocket" | "fetch">> & Pick<ClientOptions, "WebSocket" | "fetch">;
  private readonly backoff: Backoff;
  private listeners = new Map<keyof ClientEvents, Set<Listener<any>>>();
  private t: Transport | null = null;
  private hello: Hello | null = null;
  private ready = false; // the (re)connect sync is applied
  private stopped = false;
  private attempt = 0;
  private wsFailures = 0;
  /** While connected over the HTTP fallback, the WebSocket is probed with
   * backoff (5 s, doubling to 60 s): once it answers, the client moves to it. */
  private wsProbe: ReturnType<typeof setTimeout> | null = null;
  private wsProbeDelay = 0;
  private goawayUntil = 0;
  private token = ""; // the token of the current (or last) transport
  // The token the server ended a connection for (expired or revoked), and
  // why: never sent again.
  private stale: { token: string; code: string; reason: string } | null = null;
  private rid = 0;
  private pending = new Map<string, Pending>();
  private heldPushes: ServerFrame[] = [];
  private orders = new Map<string, ConvOrder>();
  private positions: Record<string, number>;
  private dirty = new Map<string, number>();
  private flushTimer: ReturnType<typeof setTimeout> | null = null;
  private flushAt = 0;
  /** The ack policy of each conversation's last push ("batch", "none"). */
  private ackPolicy = new Map<string, string>();
  private heartbeat: ReturnType<typeof setInterval> | null = null;
  private reconnectTimer: ReturnType<typeof setTimeout> | null = null;
  private waiters: Array<() => void> = [];
  private listing = false;
  private watched: string[] | null = null;

  constructor(opts: ClientOptions) {
    this.o = {
      transport: "auto", minBackoffMs: 250, maxBackoffMs: 30000, requestTimeoutMs: 10000,
      positions: new MemoryPositions(), random: Math.random, ...opts,
    } as Client["o"];
    this.o.url = this.o.url.replace(/\/+$/, "");
    this.backoff = new Backoff(this.o.minBackoffMs, this.o.maxBackoffMs, this.o.random);
    this.positions = this.o.positions.load();
  }

  on<K extends keyof ClientEvents>(ev: K, fn: Listener<ClientEvents[K]>): () => void {
    let s = this.listeners.get(ev);
    if (!s) this.listeners.set(ev, (s = new Set()));
    s.add(fn);
    return () => s!.delete(fn);
  }

  private emit<K extends keyof ClientEvents>(ev: K, payload: ClientEvents[K]) {
    for (const fn of this.listeners.get(ev) ?? []) {
      try { fn(payload); } catch (e) { console.error("parley: listener failed", e); }
    }
  }

  /** The server's hello of the current connection, or null. */
  get connection(): { hello: Hello; transport: "websocket" | "http" } | null {
    return this.ready && this.t && this.hello ? { hello: this.hello, transport: this.t.kind } : null;
  }

  /** The last seq handed over per conversation. */
  position(convId: string): number { return this.positions[convId] ?? 0; }

  /** Starts connecting (idempotent). */
  start(): void {
    if (this.t || this.reconnectTimer || this.stopped) return;
    void this.connect();
  }

  /** Stops for good: closes the connection, fails waiting requests. */
  close(): void {
    this.stop("closed by the application");
  }

  private stop(reason: string, error?: ParleyError) {
    if (this.stopped) return;
    this.stopped = true;
    if (this.reconnectTimer) clearTimeout(this.reconnectTimer);
    this.reconnectTimer = null;
    this.flush();
    this.teardown(reason);
    for (const w of this.waiters.splice(0)) w();
    this.emit("stopped", { reason, error });
  }

  private wsBase(): string { return this.o.url.replace(/^http/, "ws"); }
  private httpBase(): string { return this.o.url.replace(/^ws/, "http"); }

  private async connect(): Promise<void> {
    this.reconnectTimer = null;
    if (this.stopped) return;
    let token: string;
    try {
      token = typeof this.o.token === "function" ? await this.o.token() : this.o.token;
    } catch (e) {
      this.scheduleReconnect(`token: ${e}`, 0);
      return;
    }
    if (this.stale && token === this.stale.token) {
      this.stop(`no new token after ${this.stale.code}`, new ParleyError(this.stale.code, this.stale.reason));
      return;
    }
    this.token = token;
    const handlers = {
      onFrame: (f: ServerFrame) => this.onFrame(f),
      onClose: (info: CloseInfo) => this.onClose(t, info),
    };
    let t: Transport;
    const useHTTP = this.o.transport === "http" || (this.o.transport === "auto" && (this.wsFailures >= 2 || !this.wsCtor()));
    try {
      if (useHTTP) {
        t = await openPoll(this.fetchFn(), this.httpBase(), token, this.o.device, handlers, this.o.requestTimeoutMs);
      } else {
        t = await openWebSocket(this.wsCtor()!, this.wsBase(), token, this.o.device, handlers, this.o.requestTimeoutMs);
      }
    } catch (e) {
      const he = e instanceof HandshakeError ? e : new HandshakeError(0, "unreachable", String(e), 0, true);
      // Fall back to HTTP only while HTTP reaches the server and the
      // WebSocket does not: when neither does, the server is down, and the
      // next attempt tries the WebSocket again.
      if (!useHTTP && he.unreachable) this.wsFailures++;
      if (useHTTP && he.unreachable && this.o.transport === "auto") this.wsFailures = 0;
      if (he.code === "unauthorized" || he.code === "token_expired" || he.code === "token_revoked") {
        if (typeof this.o.token !== "function") {
          this.stop(`handshake refused: ${he.code}`, new ParleyError(he.code, he.message));
          return;
        }
      }
      if (he.status === 400 || he.code === "banned") {
        this.stop(`handshake refused: ${he.code}`, new ParleyError(he.code, he.message));
        return;
      }
      this.scheduleReconnect(`connect: ${he.message}`, he.retryAfterMs);
      return;
    }
    if (this.stopped) {
      t.close();
      return;
    }
    await this.adopt(t);
  }

  /** Makes t, just opened, the connection: sync, then ready. */
  private async adopt(t: Transport): Promise<void> {
    if (t.kind === "websocket") {
      this.wsFailures = 0;
      this.wsProbeDelay = 0;
    }
    this.t = t;
    this.hello = t.hello.hello;
    this.ready = false;
    this.heldPushes = [];
    this.orders.clear();
    const hb = this.hello.heartbeat_ms;
    this.heartbeat = setInterval(() => {
      this.request({ type: "ping" }).catch((e: ParleyError) => {
        if (e.code === "request_timeout" && this.t === t) {
          t.close();
          this.onClose(t, { reason: "ping unanswered" });
        }
      });
    }, Math.max(1000, Math.floor(hb * 0.8)));
    try {
      await this.syncAll();
    } catch (e) {
      if (this.t === t) {
        t.close();
        this.onClose(t, { reason: `sync failed: ${e}` });
      }
      return;
    }
    if (this.t !== t) return;
    this.ready = true;
    this.attempt = 0;
    for (const f of this.heldPushes.splice(0)) this.onPush(f);
    if (this.watched) this.request({ type: "presence_sub", users: this.watched }).then((r) => this.emit("presence", (r as SPresence).states), () => {});
    this.emit("connected", { hello: this.hello, transport: t.kind });
    for (const w of this.waiters.splice(0)) w();
    if (t.kind === "http" && this.o.transport === "auto" && this.wsCtor()) this.scheduleWsProbe();
  }

  private scheduleWsProbe() {
    if (this.wsProbe || this.stopped) return;
    this.wsProbeDelay = Math.min(60_000, this.wsProbeDelay ? this.wsProbeDelay * 2 : 5_000);
    this.wsProbe = setTimeout(() => { void this.probeWs(); }, Math.round(this.wsProbeDelay * (0.8 + 0.4 * Math.random())));
  }

  /** Tries the WebSocket while the HTTP fallback serves: on a hello it
   * becomes the connection (the poll session ends; a sync covers the move),
   * else the next probe is scheduled. The probe's session takes the
   * device's place on the server, so it is adopted, never just closed. */
  private async probeWs(): Promise<void> {
    this.wsProbe = null;
    const old = this.t;
    if (this.stopped || !old || old.kind !== "http" || !this.ready) {
      if (!this.stopped && old?.kind === "http") this.scheduleWsProbe();
      return;
    }
    let pt: Transport;
    const handlers = {
      onFrame: (f: ServerFrame) => { if (this.t === pt) this.onFrame(f); },
      onClose: (info: CloseInfo) => this.onClose(pt, info),
    };
    try {
      pt = await openWebSocket(this.wsCtor()!, this.wsBase(), this.token, this.o.device, handlers, this.o.requestTimeoutMs);
    } catch {
      if (this.t === old && !this.stopped) this.scheduleWsProbe();
      return;
    }
    if (this.stopped || this.t !== old) {
      pt.close();
      return;
    }
    this.flush();
    this.teardown("moving to the WebSocket");
    await this.adopt(pt);
  }

  private wsCtor(): WebSocketCtor | undefined {
    return this.o.WebSocket ?? (globalThis as { WebSocket?: WebSocketCtor }).WebSocket;
  }
  private fetchFn(): typeof fetch { return this.o.fetch ?? globalThis.fetch.bind(globalThis); }

  private teardown(reason: string) {
    if (this.heartbeat) clearInterval(this.heartbeat);
    this.heartbeat = null;
    if (this.wsProbe) clearTimeout(this.wsProbe);
    this.wsProbe = null;
    const t = this.t;
    this.t = null;
    this.ready = false;
    t?.close();
    for (const [rid, p] of this.pending) {
      clearTimeout(p.timer);
      p.reject(new ParleyError("connection_lost", reason));
      this.pending.delete(rid);
    }
  }

  private onClose(t: Transport, info: CloseInfo) {
    if (this.t !== t) return;
    this.flush();
    this.teardown(info.reason);
    this.emit("disconnected", info.code ? { reason: info.reason, code: info.code } : { reason: info.reason });
    if (info.code === 4009) {
      this.stop("replaced: the same user and device connected again", new ParleyError("replaced", info.reason));
      return;
    }
    if (info.code === 4003) {
      this.stop("banned: the operator banned this user", new ParleyError("banned", info.reason));
      return;
    }
    if (info.code === 4001 || info.code === 4002) {
      const code = info.code === 4001 ? "token_expired" : "token_revoked";
      if (typeof this.o.token !== "function") {
        this.stop(`${code}: the fixed token is no longer accepted`, new ParleyError(code, info.reason));
        return;
      }
      // A new token is all it needs: the first backoff step only.
      this.stale = { token: this.token, code, reason: info.reason };
      this.attempt = 0;
      this.scheduleReconnect(info.reason, 0);
      return;
    }
    if (info.code === 4004) {
      // The operator disconnected this device: reconnect, never at once.
      this.scheduleReconnect(info.reason, Math.max(this.o.minBackoffMs, this.backoff.delay(this.attempt)));
      return;
    }
    if (info.code === 4010 || info.code === 1002 || info.code === 1003 || info.code === 1009) {
      this.stop(`closed with ${info.code}: fix the client`, new ParleyError("protocol", info.reason));
      return;
    }
    const goaway = Math.max(0, this.goawayUntil - Date.now());
    this.goawayUntil = 0;
    this.scheduleReconnect(info.reason, goaway);
  }

  private scheduleReconnect(reason: string, askedMs: number) {
    if (this.stopped) return;
    const delay = askedMs > 0 ? this.backoff.after(askedMs) : this.backoff.delay(this.attempt);
    this.attempt++;
    this.emit("reconnecting", { delayMs: delay, at: Date.now() + delay, attempt: this.attempt });
    this.reconnectTimer = setTimeout(() => void this.connect(), delay);
    void reason;
  }

  /** Reconnects now instead of waiting out the backoff (a "retry now" button). */
  reconnectNow(): void {
    if (this.stopped || this.t || !this.reconnectTimer) return;
    clearTimeout(this.reconnectTimer);
    void this.connect();
  }

  private onFrame(f: ServerFrame) {
    if ("rid" in f && f.rid !== undefined && this.pending.has(f.rid)) {
      const p = this.pending.get(f.rid)!;
      this.pending.delete(f.rid);
      clearTimeout(p.timer);
      if (f.type === "error") p.reject(parleyError(f.code, f.error, f.retry_after_ms ?? 0));
      else p.resolve(f);
      return;
    }
    switch (f.type) {
      case "goaway": {
        // Keep using the connection until the node closes it; reconnect
        // no sooner than the delay it asked for.
        this.goawayUntil = Date.now() + (f.retry_after_ms ?? 0);
        this.emit("draining", { retryAfterMs: f.retry_after_ms ?? 0 });
        const t = this.t;
        setTimeout(() => {
          if (this.t === t && t) {
            t.close();
            this.onClose(t, { reason: "goaway" });
          }
        }, this.backoff.after(f.retry_after_ms ?? 0));
        return;
      }
      case "msg": case "reactions": case "receipt": case "typing": case "presence": case "conv_mute": case "dnd":
        if (!this.ready) this.heldPushes.push(f);
        else this.onPush(f);
        return;
    }
  }

  private onPush(f: ServerFrame) {
    switch (f.type) {
      case "receipt": {
        const r = f as SReceipt;
        this.emit("receipt", { conv_id: r.conv_id, user_id: r.user_id, device_id: r.device_id, seq: r.seq, state: r.state });
        return;
      }
      case "typing":
        this.emit("typing", { convId: f.conv_id, userId: f.user_id });
        return;
      case "conv_mute": {
        const m = f as SConvMute;
        this.emit("mute", { convId: m.conv_id, muteUntil: m.mute_until });
        return;
      }
      case "dnd":
        this.emit("dnd", (f as SDnd).dnd);
        return;
      case "presence":
        this.emit("presence", f.states);
        return;
      case "reactions": {
        // A medium or large group's coalesced reaction events: offered
        // as the stubs a history page would hold, so they fill the
        // conversation's position like any push.
        const r = f as SReactions;
        const o = this.order(r.conv_id);
        if (r.ack) this.ackPolicy.set(r.conv_id, r.ack);
        else this.ackPolicy.delete(r.conv_id);
        if (!o.known) {
          void this.list();
          return;
        }
        const ready: Message[] = [];
        for (const m of reactionStubs(r)) ready.push(...o.offer(m));
        this.deliver(r.conv_id, ready);
        this.maybeFetch(r.conv_id, o);
        return;
      }
      case "msg": {
        const m = f.message;
        const o = this.order(m.conv_id);
        if (f.ack) this.ackPolicy.set(m.conv_id, f.ack);
        else this.ackPolicy.delete(m.conv_id);
        const ready = o.offer(m);
        if (!o.known) {
          void this.list();
          return;
        }
        this.deliver(m.conv_id, ready);
        this.maybeFetch(m.conv_id, o);
      }
    }
  }

  private order(convId: string): ConvOrder {
    let o = this.orders.get(convId);
    if (!o) {
      const known = convId in this.positions;
      o = new ConvOrder(this.positions[convId] ?? 0, known);
      this.orders.set(convId, o);
    }
    return o;
  }

  private deliver(convId: string, msgs: Message[]) {
    for (const m of msgs) {
      this.emit("message", { convId, message: m });
      this.positions[convId] = m.seq;
      this.dirty.set(convId, m.seq);
    }
    if (msgs.length > 0) this.armFlush(this.ackPolicy.has(convId) ? batchDelayMs : deliveredDelayMs);
  }

  /** Makes sure a flush runs within delayMs. */
  private armFlush(delayMs: number) {
    const at = Date.now() + delayMs;
    if (this.flushTimer) {
      if (at >= this.flushAt) return;
      clearTimeout(this.flushTimer);
    }
    this.flushAt = at;
    this.flushTimer = setTimeout(() => this.flush(), delayMs);
  }

  /** Saves positions, then acknowledges them: one cumulative delivered
   * frame for all (several only past max_sync_convs), a large group's left out. */
  private flush() {
    if (this.flushTimer) clearTimeout(this.flushTimer);
    this.flushTimer = null;
    const ps: Position[] = [];
    for (const [convId, seq] of this.dirty) {
      this.o.positions.save(convId, seq);
      if (this.ackPolicy.get(convId) !== "none") ps.push({ conv_id: convId, seq });
    }
    this.dirty.clear();
    if (!this.t) return;
    const max = this.hello?.limits.max_sync_convs ?? 1000;
    for (let i = 0; i < ps.length; i += max) {
      const chunk = ps.slice(i, i + max);
      if (chunk.length === 1) this.t.send({ type: "delivered", conv_id: chunk[0].conv_id, seq: chunk[0].seq });
      else this.t.send({ type: "delivered", positions: chunk });
    }
  }

  private async syncAll(): Promise<void> {
    const convs: SyncConv[] = Object.entries(this.positions).map(([conv_id, after_seq]) => ({ conv_id, after_seq }));
    const max = this.hello!.limits.max_sync_convs;
    const chunks: SyncConv[][] = [];
    for (let i = 0; i < convs.length; i += max) chunks.push(convs.slice(i, i + max));
    if (chunks.length === 0) chunks.push([]);
    for (const chunk of chunks) {
      for (;;) {
        try {
          const r = (await this.requestNow({ type: "sync", all: true, convs: chunk })) as SSnapshot;
          this.applySnapshot(r.snapshot);
          break;
        } catch (e) {
          const pe = e as ParleyError;
          if (pe.code === "connection_lost" || pe.code === "request_timeout" || !pe.retryable) throw pe;
          await sleep(pe.retryAfterMs ? this.backoff.after(pe.retryAfterMs) : 1000);
        }
      }
    }
  }

  private applySnapshot(snaps: ConvSnapshot[]) {
    for (const s of snaps) {
      const o = this.order(s.conv_id);
      const ready: Message[] = [];
      if (!o.known || s.from_seq > o.last) ready.push(...o.jumpTo(s.from_seq).ready);
      let skipped = 0;
      if ((s.more_unread ?? 0) > 0 && s.messages.length > 0) {
        const j = o.jumpTo(s.messages[0].seq - 1);
        ready.push(...j.ready);
        skipped = j.skipped;
      }
      this.emit("snapshot", { convId: s.conv_id, snapshot: { ...s, messages: [] }, skipped });
      for (const m of s.messages) ready.push(...o.offer(m));
      this.deliver(s.conv_id, ready);
      this.maybeFetch(s.conv_id, o);
    }
  }

  private maybeFetch(convId: string, o: ConvOrder) {
    if (o.needFetch()) void this.fetch(convId, o);
  }

  /** Fetches the page after the conversation's position to fill a hole. */
  private async fetch(convId: string, o: ConvOrder) {
    const after = o.startFetch();
    const t = this.t;
    let r: SHistory;
    try {
      r = (await this.requestNow({ type: "history", conv_id: convId, after_seq: after, limit: this.hello!.limits.max_history })) as SHistory;
    } catch (e) {
      o.fetchFailed();
      const pe = e as ParleyError;
      if (pe.code === "connection_lost" || this.t !== t) return;
      if (!pe.retryable) {
        this.deliver(convId, o.releaseAll());
        return;
      }
      setTimeout(() => { if (this.t === t) this.maybeFetch(convId, o); }, pe.retryAfterMs || 1000);
      return;
    }
    if (this.t !== t) return;
    const { ready, again } = o.fill(r.messages, r.has_more ?? false);
    this.deliver(convId, ready);
    if (again && !o.fetching) void this.fetch(convId, o);
  }

  /** The conversation list gives the starting point of conversations first seen through a push. */
  private async list() {
    if (this.listing) return;
    this.listing = true;
    let list: ConvSummary[];
    try {
      list = ((await this.requestNow({ type: "conv_list" })) as SConvList).list;
    } catch {
      this.listing = false;
      setTimeout(() => { if (this.ready) void this.list(); }, 1000);
      return;
    } finally {
      this.listing = false;
    }
    const listed = new Set<string>();
    for (const s of list) {
      listed.add(s.conv_id);
      const o = this.order(s.conv_id);
      if (!o.known && o.hole()) {
        let base = Math.max(s.read_seq, s.join_seq > 0 ? s.join_seq - 1 : 0);
        const low = o.minPendingSeq();
        if (low !== 0 && low - 1 < base) base = low - 1;
        const ready = o.jumpTo(base).ready;
        // The starting point is announced as a sync's is: a snapshot event without messages.
        this.emit("snapshot", {
          convId: s.conv_id,
          snapshot: {
            conv_id: s.conv_id, kind: s.kind, last_seq: s.last_seq, read_seq: s.read_seq, join_seq: s.join_seq,
            unread: s.unread, from_seq: base, messages: [],
          },
          skipped: 0,
        });
        this.deliver(s.conv_id, ready);
      }
      this.maybeFetch(s.conv_id, o);
    }
    for (const [convId, o] of this.orders) {
      if (!o.known && o.hole() && !listed.has(convId)) {
        this.deliver(convId, o.jumpTo(o.minPendingSeq() - 1).ready);
        this.maybeFetch(convId, o);
      }
    }
  }

  /** Waits until a connection is up and synced (or the client stopped). */
  private whenReady(): Promise<void> {
    if (this.ready || this.stopped) return Promise.resolve();
    return new Promise((res) => this.waiters.push(res));
  }

  /** Sends f on the current connection (no waiting for one), resolving with its answer. */
  private requestNow(f: Record<string, unknown>): Promise<ServerFrame> {
    const t = this.t;
    if (!t) return Promise.reject(new ParleyError("connection_lost", "not connected"));
    const rid = String(++this.rid);
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(rid);
        reject(new ParleyError("request_timeout", `no answer to ${String(f.type)} within ${this.o.requestTimeoutMs} ms`));
      }, this.o.requestTimeoutMs);
      this.pending.set(rid, { resolve, reject, timer });
      t.send({ ...f, rid });
    });
  }

  /**
   * Sends one request once connected. With retry, a retryable failure
   * (connection lost, timeout, store_unavailable, overloaded after its
   * retry_after_ms...) is retried on this or the next connection, at most
   * `attempts` times.
   */
  async request(f: Record<string, unknown>, retry = false, attempts = 8): Promise<ServerFrame> {
    for (let i = 0; ; i++) {
      await this.whenReady();
      if (this.stopped) throw new ParleyError("stopped", "the client is stopped");
      try {
        return await this.requestNow(f);
      } catch (e) {
        const pe = e as ParleyError;
        if (!retry || !pe.retryable || i + 1 >= attempts) throw pe;
        if (pe.retryAfterMs) await sleep(this.backoff.after(pe.retryAfterMs));
        else if (pe.code !== "connection_lost") await sleep(this.backoff.delay(i));
      }
    }
  }

  /**
   * Stores a message: one client_msg_id for every attempt, retried until the
   * server acks it or refuses it with a non-retryable error, so a lost ack or
   * a reconnect never stores it twice.
   */
  async send(convId: string, body: string, opts: SendOptions = {}): Promise<Ack> {
    const f: Record<string, unknown> = { type: "send", conv_id: convId, client_msg_id: opts.clientMsgId ?? newClientMsgId(), body };
    if (opts.kind) f.kind = opts.kind;
    if (opts.coalesceKey) f.coalesce_key = opts.coalesceKey;
    if (opts.mentions?.length) f.mentions = opts.mentions;
    if (opts.mentionAll) f.mention_all = true;
    if (opts.replyTo) f.reply_to = opts.replyTo;
    return this.stored(f);
  }

  /** Edits one of your text messages (an event with its own seq). */
  edit(convId: string, targetSeq: number, body: string, clientMsgId = newClientMsgId()): Promise<Ack> {
    return this.stored({ type: "edit", conv_id: convId, client_msg_id: clientMsgId, target_seq: targetSeq, body });
  }

  /**
   * Adds emoji (one of hello's reactions) to your reactions to message
   * targetSeq: an event with its own seq. An end-to-end encrypted
   * conversation refuses it (e2e_unsupported).
   */
  react(convId: string, targetSeq: number, emoji: string, clientMsgId = newClientMsgId()): Promise<Ack> {
    return this.stored({ type: "react", conv_id: convId, client_msg_id: clientMsgId, target_seq: targetSeq, emoji });
  }

  /** Takes emoji back from your reactions to message targetSeq. */
  unreact(convId: string, targetSeq: number, emoji: string, clientMsgId = newClientMsgId()): Promise<Ack> {
    return this.stored({ type: "react", conv_id: convId, client_msg_id: clientMsgId, target_seq: targetSeq, emoji, remove: true });
  }

  /** Recalls one of your text messages. */
  recall(convId: string, targetSeq: number, clientMsgId = newClientMsgId()): Promise<Ack> {
    return this.stored({ type: "recall", conv_id: convId, client_msg_id: clientMsgId, target_seq: targetSeq });
  }

  private async stored(f: Record<string, unknown>): Promise<Ack> {
    const r = (await this.request(f, true, Number.MAX_SAFE_INTEGER)) as SAck;
    return { conv_id: r.conv_id, client_msg_id: r.client_msg_id, seq: r.seq, msg_id: r.msg_id, server_time: r.server_time, duplicate: r.duplicate };
  }

  /** Raises the read position (clears the unread count on every device of the user). */
  async read(convId: string, seq: number): Promise<void> {
    await this.request({ type: "read", conv_id: convId, seq }, true);
  }

  /** Tells the other members you are typing (the server rate-limits these). */
  typing(convId: string): void {
    if (this.ready && this.t) this.t.send({ type: "typing", conv_id: convId });
  }

  /** Watches these users' presence (replaces the list; kept across reconnects). */
  async watchPresence(users: string[]): Promise<PresenceState[]> {
    this.watched = users;
    return ((await this.request({ type: "presence_sub", users }, true)) as SPresence).states;
  }

  /** A page of history: forward from afterSeq, or the latest before beforeSeq (0: newest). */
  async history(convId: string, q: { afterSeq?: number; beforeSeq?: number; limit?: number } = {}): Promise<{ messages: Message[]; hasMore: boolean }> {
    const f: Record<string, unknown> = { type: "history", conv_id: convId };
    if (q.afterSeq !== undefined) f.after_seq = q.afterSeq;
    if (q.beforeSeq) f.before_seq = q.beforeSeq;
    if (q.limit) f.limit = q.limit;
    const r = (await this.request(f, true)) as SHistory;
    return { messages: r.messages, hasMore: r.has_more ?? false };
  }

  /**
   * Searches the plain conversations this user is a member of (within its
   * membership windows) for q.text as a phrase; Chinese matches as an exact
   * character sequence. Pass the result's cursor back for the next page.
   * Highlights are [start, end) offsets into each snippet, in UTF-16 code
   * units (string indexes). End-to-end encrypted conversations are never on
   * the server.
   */
  async search(q: SearchQuery): Promise<SearchResult> {
    return ((await this.request({ type: "search", query: q }, true)) as SSearch).search;
  }

  /**
   * Read receipts of message seq: how many of the members who can see it
   * have read it ("read by N of M") and, in a small enough group, who.
   */
  async readBy(convId: string, seq: number): Promise<ReadBy> {
    return ((await this.request({ type: "read_by", conv_id: convId, seq }, true)) as SReadBy).read_by;
  }

  /**
   * Registers this device's push token or Web Push subscription
   * (push_register); resolves with the device's registrations. Registering
   * one again refreshes it; one another device held moves here.
   */
  async pushRegister(reg: PushRegistration): Promise<PushRegistration[]> {
    return ((await this.request({ type: "push_register", push: reg }, true)) as SPush).registrations;
  }

  /** Removes one of this device's push registrations (push_remove), or every one without reg. */
  async pushRemove(reg?: { provider: PushRegistration["provider"]; token?: string; endpoint?: string }): Promise<PushRegistration[]> {
    return ((await this.request(reg ? { type: "push_remove", push: reg } : { type: "push_remove" }, true)) as SPush).registrations;
  }

  /**
   * The server's VAPID public key from the current connection's hello, the
   * applicationServerKey of pushManager.subscribe; null when the server
   * sends no Web Push (or before the first connection).
   */
  get webPushKey(): string | null {
    return this.connection?.hello.webpush_key ?? null;
  }

  async conversations(): Promise<ConvSummary[]> {
    return ((await this.request({ type: "conv_list" }, true)) as SConvList).list;
  }

  private async conv(f: Record<string, unknown>, retry: boolean): Promise<ConvInfo> {
    return ((await this.request(f, retry)) as SConv).conv;
  }
  /** opts.e2e: an end-to-end encrypted conversation (fixed at creation; bodies must be E2E envelopes, see e2ee/E2EChat). */
  openDirect(peer: string, opts: { e2e?: boolean } = {}): Promise<ConvInfo> { return this.conv({ type: "open_direct", peer, ...(opts.e2e ? { e2e: true } : {}) }, true); }
  /** Not retried: a lost answer could otherwise create a second group. */
  createGroup(name: string, members: string[], opts: { e2e?: boolean } = {}): Promise<ConvInfo> { return this.conv({ type: "create_group", name, members, ...(opts.e2e ? { e2e: true } : {}) }, false); }
  addMembers(convId: string, members: string[]): Promise<ConvInfo> { return this.conv({ type: "add_members", conv_id: convId, members }, true); }
  removeMembers(convId: string, members: string[]): Promise<ConvInfo> { return this.conv({ type: "remove_members", conv_id: convId, members }, true); }
  leave(convId: string): Promise<ConvInfo> { return this.conv({ type: "leave", conv_id: convId }, false); }
  setRole(convId: string, userId: string, role: "member" | "admin"): Promise<ConvInfo> { return this.conv({ type: "set_role", conv_id: convId, user_id: userId, role }, true); }
  mute(convId: string, userId: string, muted: boolean): Promise<ConvInfo> { return this.conv({ type: "mute", conv_id: convId, user_id: userId, muted }, true); }
  /**
   * Mutes this user's notifications of a conversation until untilMs (Unix
   * ms; omitted: until unmuteConv). Messages still arrive and count as
   * unread; only push notifications stop. The answer's mute_until, and
   * every device's conv_list, show it.
   */
  muteConv(convId: string, untilMs?: number): Promise<ConvInfo> { return this.conv({ type: "conv_mute", conv_id: convId, ...(untilMs ? { mute_until: untilMs } : {}) }, true); }
  unmuteConv(convId: string): Promise<ConvInfo> { return this.conv({ type: "conv_unmute", conv_id: convId }, true); }
  /** Sets this user's do-not-disturb ({} or omitted: off): no notification is sent while it holds. */
  async setDnd(dnd: DND = {}): Promise<DND> {
    const f: Record<string, unknown> = { type: "dnd_set" };
    if (dnd.until || dnd.daily) f.dnd = dnd;
    return ((await this.request(f, true)) as SDnd).dnd;
  }
  async dnd(): Promise<DND> { return ((await this.request({ type: "dnd_get" }, true)) as SDnd).dnd; }

  private attachConn(): AttachConn {
    return { request: (f, retry, attempts) => this.request(f, retry, attempts), fetch: this.fetchFn(), httpBase: this.httpBase(), xhr: !this.o.fetch };
  }

  /**
   * The server's attachment limits from the current connection's hello:
   * maxFileBytes 0 means attachments are off.
   */
  get attachmentLimits(): { maxFileBytes: number; partBytes: number } | null {
    const h = this.connection?.hello as { max_file_bytes?: number; part_bytes?: number } | undefined;
    return h ? { maxFileBytes: h.max_file_bytes ?? 0, partBytes: h.part_bytes ?? 0 } : null;
  }

  /**
   * Uploads a file to a conversation: SHA-256 first, then upload_create and
   * every part (upload_part, then a PUT to the URL it names), then
   * upload_complete. Resolves with the complete upload, whose attachment_id
   * sendFile names. A failed or aborted upload can be resumed with resume().
   */
  upload(convId: string, data: UploadData, opts?: UploadOptions): Promise<UploadInfo> {
    return upload(this.attachConn(), convId, data, opts);
  }

  /** Sends the rest of an upload (after a restart, a lost connection or an abort), from the parts the server has. */
  resume(attachmentId: string, data: UploadData, opts?: ResumeOptions): Promise<UploadInfo> {
    return resume(this.attachConn(), attachmentId, data, opts);
  }

  /** Stores a message of kind file naming a complete upload (retried with one client_msg_id, like send). */
  sendFile(convId: string, attachmentId: string, opts: SendFileOptions = {}): Promise<Ack> {
    return this.stored(sendFileFrame(convId, attachmentId, opts, opts.clientMsgId ?? newClientMsgId()));
  }

  /** A short-lived URL (absolute) of the file of message seq, or of its thumbnail: for <img src>, <audio src>, a link. */
  attachmentUrl(convId: string, seq: number, opts?: { thumbnail?: boolean }): Promise<AttachmentInfo> {
    return attachmentUrl(this.attachConn(), convId, seq, opts);
  }

  /** Downloads the file (or its thumbnail, or a byte range) of message seq. */
  download(convId: string, seq: number, opts?: DownloadOptions): Promise<Download> {
    return download(this.attachConn(), convId, seq, opts);
  }
}

function sleep(ms: number): Promise<void> { return new Promise((r) => setTimeout(r, ms)); }

export type { SError };


/**
 * The target and counts a reaction event sets (null: not a reaction
 * event, or a superseded stub that sets nothing). A reaction pushed on its
 * own carries its emoji in body and its target's counts after it; read
 * back or coalesced, it is a stub whose last one per target carries the
 * counts (with me on reads).
 */
export function reactionUpdate(m: Message): { target: number; reactions: Reaction[] } | null {
  if ((m.kind !== "react" && m.kind !== "unreact") || m.superseded) return null;
  return { target: m.target_seq ?? 0, reactions: m.reactions ?? [] };
}

/**
 * The seqs a reactions push covers (from_seq..seq) as history's stubs:
 * one reaction event each, the last reacted.length carrying each target's
 * counts, the others superseded.
 */
export function reactionStubs(f: SReactions): Message[] {
  const out: Message[] = [];
  if (f.seq < f.from_seq) return out;
  const n = f.seq - f.from_seq + 1;
  const carried = Math.min(f.reacted.length, n);
  for (let s = f.from_seq; s <= f.seq; s++) {
    const m: Message = { conv_id: f.conv_id, seq: s, msg_id: "0", sender: "", kind: "react", server_time: 0, superseded: true };
    const k = f.seq - s;
    if (k < carried) {
      const r = f.reacted[carried - 1 - k];
      m.superseded = false;
      m.target_seq = r.seq;
      m.reactions = r.reactions;
    }
    out.push(m);
  }
  return out;
}
