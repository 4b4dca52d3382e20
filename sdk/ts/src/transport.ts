import type { ServerFrame, SHello } from "./frames.js";

/** Why a transport ended. */
export interface CloseInfo {
  /** WebSocket close code, if one came. */
  code?: number;
  reason: string;
}

export interface Handlers {
  onFrame(f: ServerFrame): void;
  onClose(info: CloseInfo): void;
}

/** One open connection: WebSocket, or an HTTP-fallback poll session. */
export interface Transport {
  readonly kind: "websocket" | "http";
  readonly hello: SHello;
  send(frame: object): void;
  close(): void;
}

/** A handshake the server refused with an HTTP status (readable over HTTP only). */
export class HandshakeError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly retryAfterMs: number,
    /** true when no WebSocket could even be opened (no status known). */
    readonly unreachable = false,
  ) {
    super(message);
  }
}

/** The browser's (or the ws package's) WebSocket constructor. */
export type WebSocketCtor = new (url: string, protocols?: string | string[]) => WebSocketLike;

/** The subprotocols that carry the token (docs/protocol.md, "Authentication"):
 * a browser cannot set Authorization on a WebSocket, and a token in the URL
 * would be printed in the console on a failed dial and kept in access logs. */
export const SUBPROTOCOL = "parley.v1";
export const BEARER_SUBPROTOCOL_PREFIX = "bearer.";
export interface WebSocketLike {
  readyState: number;
  onopen: ((ev: any) => void) | null;
  onmessage: ((ev: { data: any }) => void) | null;
  onclose: ((ev: { code: number; reason: string }) => void) | null;
  onerror: ((ev: any) => void) | null;
  send(data: string): void;
  close(code?: number, reason?: string): void;
}

/** Opens a WebSocket and resolves once the server's hello arrived. */
export function openWebSocket(
  Ctor: WebSocketCtor, wsBase: string, token: string, device: string, h: Handlers, timeoutMs: number,
): Promise<Transport> {
  const url = `${wsBase}/v1/ws?device=${encodeURIComponent(device)}`;
  return new Promise((resolve, reject) => {
    let ws: WebSocketLike;
    try {
      ws = new Ctor(url, [SUBPROTOCOL, BEARER_SUBPROTOCOL_PREFIX + token]);
    } catch (e) {
      reject(new HandshakeError(0, "unreachable", String(e), 0, true));
      return;
    }
    let opened = false;
    let t: Transport | null = null;
    const timer = setTimeout(() => {
      if (!t) {
        try { ws.close(); } catch { /* already closing */ }
        reject(new HandshakeError(0, "timeout", "no hello within the request timeout", 0, !opened));
      }
    }, timeoutMs);
    ws.onopen = () => { opened = true; };
    ws.onerror = () => { /* onclose follows */ };
    ws.onclose = (ev) => {
      clearTimeout(timer);
      if (!t) {
        reject(new HandshakeError(0, "closed", `websocket closed before hello (${ev.code} ${ev.reason})`, 0, !opened));
        return;
      }
      h.onClose({ code: ev.code, reason: ev.reason || `closed with ${ev.code}` });
    };
    ws.onmessage = (ev) => {
      let f: ServerFrame;
      try {
        f = JSON.parse(String(ev.data));
      } catch {
        return; // the server sends JSON objects only
      }
      if (!t) {
        if (f.type !== "hello") return;
        clearTimeout(timer);
        t = {
          kind: "websocket",
          hello: f,
          send: (frame) => { if (ws.readyState === 1) ws.send(JSON.stringify(frame)); },
          close: () => { try { ws.close(1000, "client closing"); } catch { /* ignore */ } },
        };
        resolve(t);
        return;
      }
      h.onFrame(f);
    };
  });
}

async function refusal(resp: Response): Promise<HandshakeError> {
  let code = "http_" + resp.status, msg = resp.statusText, after = 0;
  try {
    const body = await resp.json();
    code = body.code ?? code;
    msg = body.error ?? msg;
    after = body.retry_after_ms ?? 0;
  } catch { /* not JSON */ }
  const ra = resp.headers.get("Retry-After");
  if (!after && ra && /^\d+$/.test(ra)) after = Number(ra) * 1000;
  return new HandshakeError(resp.status, code, msg, after);
}

/**
 * Opens an HTTP-fallback session (GET /v1/poll, POST /v1/rpc) for clients
 * whose WebSocket cannot open. Frames arrive through polls; each request's
 * answer comes back from its POST and is handed to onFrame like a pushed
 * frame.
 */
export async function openPoll(
  fetchFn: typeof fetch, httpBase: string, token: string, device: string, h: Handlers, timeoutMs: number,
): Promise<Transport> {
  const auth = { Authorization: `Bearer ${token}` };
  const dev = `device=${encodeURIComponent(device)}`;
  let resp: Response;
  try {
    resp = await fetchFn(`${httpBase}/v1/poll?${dev}`, { headers: auth, signal: AbortSignal.timeout(timeoutMs) });
  } catch (e) {
    throw new HandshakeError(0, "unreachable", String(e), 0, true);
  }
  if (!resp.ok) throw await refusal(resp);
  const first = (await resp.json()).frames as ServerFrame[];
  const hello = first.find((f) => f.type === "hello") as SHello | undefined;
  if (!hello) throw new HandshakeError(resp.status, "bad_frame", "poll session opened without hello", 0);
  const session = encodeURIComponent(hello.hello.session_id);
  let closed = false;
  const ctl = new AbortController();
  const end = (reason: string, code?: number) => {
    if (closed) return;
    closed = true;
    ctl.abort();
    h.onClose(code ? { reason, code } : { reason });
  };
  const t: Transport = {
    kind: "http",
    hello,
    send: (frame) => {
      if (closed) return;
      fetchFn(`${httpBase}/v1/rpc?${dev}&session=${session}`, {
        method: "POST", headers: { ...auth, "Content-Type": "application/json" }, body: JSON.stringify(frame), signal: ctl.signal,
      }).then(async (r) => {
        if (r.ok) {
          h.onFrame(await r.json());
          return;
        }
        const e = await refusal(r);
        const rid = (frame as { rid?: string }).rid;
        h.onFrame({ type: "error", rid, code: e.code as never, error: e.message, ...(e.retryAfterMs ? { retry_after_ms: e.retryAfterMs } : {}) });
      }).catch((e) => end(`rpc failed: ${e}`));
    },
    close: () => end("client closing"),
  };
  const wait = hello.hello.heartbeat_ms;
  (async () => {
    while (!closed) {
      try {
        const r = await fetchFn(`${httpBase}/v1/poll?${dev}&session=${session}&wait_ms=${wait}`, { headers: auth, signal: ctl.signal });
        if (!r.ok) {
          // The refusals a WebSocket would get as a close code.
          const e = await refusal(r);
          const code = ({ token_expired: 4001, token_revoked: 4002, banned: 4003 } as Record<string, number>)[e.code];
          end(`poll answered ${r.status} ${e.code}: ${e.message}`, code);
          return;
        }
        const body = await r.json();
        for (const f of body.frames as ServerFrame[]) if (!closed) h.onFrame(f);
      } catch (e) {
        end(`poll failed: ${e}`);
        return;
      }
    }
  })();
  return t;
}
