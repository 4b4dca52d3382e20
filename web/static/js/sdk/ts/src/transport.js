/** A handshake the server refused with an HTTP status (readable over HTTP only). */
export class HandshakeError extends Error {
    status;
    code;
    retryAfterMs;
    unreachable;
    constructor(status, code, message, retryAfterMs, 
    /** true when no WebSocket could even be opened (no status known). */
    unreachable = false) {
        super(message);
        this.status = status;
        this.code = code;
        this.retryAfterMs = retryAfterMs;
        this.unreachable = unreachable;
    }
}
/** The subprotocols that carry the token (docs/protocol.md, "Authentication"):
 * a browser cannot set Authorization on a WebSocket, and a token in the URL
 * would be printed in the console on a failed dial and kept in access logs. */
export const SUBPROTOCOL = "parley.v1";
export const BEARER_SUBPROTOCOL_PREFIX = "bearer.";
/** Opens a WebSocket and resolves once the server's hello arrived. */
export function openWebSocket(Ctor, wsBase, token, device, h, timeoutMs) {
    const url = `${wsBase}/v1/ws?device=${encodeURIComponent(device)}`;
    return new Promise((resolve, reject) => {
        let ws;
        try {
            ws = new Ctor(url, [SUBPROTOCOL, BEARER_SUBPROTOCOL_PREFIX + token]);
        }
        catch (e) {
            reject(new HandshakeError(0, "unreachable", String(e), 0, true));
            return;
        }
        let opened = false;
        let t = null;
        const timer = setTimeout(() => {
            if (!t) {
                try {
                    ws.close();
                }
                catch { /* already closing */ }
                reject(new HandshakeError(0, "timeout", "no hello within the request timeout", 0, !opened));
            }
        }, timeoutMs);
        ws.onopen = () => { opened = true; };
        ws.onerror = () => { };
        ws.onclose = (ev) => {
            clearTimeout(timer);
            if (!t) {
                reject(new HandshakeError(0, "closed", `websocket closed before hello (${ev.code} ${ev.reason})`, 0, !opened));
                return;
            }
            h.onClose({ code: ev.code, reason: ev.reason || `closed with ${ev.code}` });
        };
        ws.onmessage = (ev) => {
            let f;
            try {
                f = JSON.parse(String(ev.data));
            }
            catch {
                return; // the server sends JSON objects only
            }
            if (!t) {
                if (f.type !== "hello")
                    return;
                clearTimeout(timer);
                t = {
                    kind: "websocket",
                    hello: f,
                    send: (frame) => { if (ws.readyState === 1)
                        ws.send(JSON.stringify(frame)); },
                    close: () => { try {
                        ws.close(1000, "client closing");
                    }
                    catch { /* ignore */ } },
                };
                resolve(t);
                return;
            }
            h.onFrame(f);
        };
    });
}
async function refusal(resp) {
    let code = "http_" + resp.status, msg = resp.statusText, after = 0;
    try {
        const body = await resp.json();
        code = body.code ?? code;
        msg = body.error ?? msg;
        after = body.retry_after_ms ?? 0;
    }
    catch { /* not JSON */ }
    const ra = resp.headers.get("Retry-After");
    if (!after && ra && /^\d+$/.test(ra))
        after = Number(ra) * 1000;
    return new HandshakeError(resp.status, code, msg, after);
}
/**
 * Opens an HTTP-fallback session (GET /v1/poll, POST /v1/rpc) for clients
 * whose WebSocket cannot open. Frames arrive through polls; each request's
 * answer comes back from its POST and is handed to onFrame like a pushed
 * frame.
 */
export async function openPoll(fetchFn, httpBase, token, device, h, timeoutMs) {
    const auth = { Authorization: `Bearer ${token}` };
    const dev = `device=${encodeURIComponent(device)}`;
    let resp;
    try {
        resp = await fetchFn(`${httpBase}/v1/poll?${dev}`, { headers: auth, signal: AbortSignal.timeout(timeoutMs) });
    }
    catch (e) {
        throw new HandshakeError(0, "unreachable", String(e), 0, true);
    }
    if (!resp.ok)
        throw await refusal(resp);
    const first = (await resp.json()).frames;
    const hello = first.find((f) => f.type === "hello");
    if (!hello)
        throw new HandshakeError(resp.status, "bad_frame", "poll session opened without hello", 0);
    const session = encodeURIComponent(hello.hello.session_id);
    let closed = false;
    const ctl = new AbortController();
    const end = (reason, code) => {
        if (closed)
            return;
        closed = true;
        ctl.abort();
        h.onClose(code ? { reason, code } : { reason });
    };
    const t = {
        kind: "http",
        hello,
        send: (frame) => {
            if (closed)
                return;
            fetchFn(`${httpBase}/v1/rpc?${dev}&session=${session}`, {
                method: "POST", headers: { ...auth, "Content-Type": "application/json" }, body: JSON.stringify(frame), signal: ctl.signal,
            }).then(async (r) => {
                if (r.ok) {
                    h.onFrame(await r.json());
                    return;
                }
                const e = await refusal(r);
                const rid = frame.rid;
                h.onFrame({ type: "error", rid, code: e.code, error: e.message, ...(e.retryAfterMs ? { retry_after_ms: e.retryAfterMs } : {}) });
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
                    const code = { token_expired: 4001, token_revoked: 4002, banned: 4003 }[e.code];
                    end(`poll answered ${r.status} ${e.code}: ${e.message}`, code);
                    return;
                }
                const body = await r.json();
                for (const f of body.frames)
                    if (!closed)
                        h.onFrame(f);
            }
            catch (e) {
                end(`poll failed: ${e}`);
                return;
            }
        }
    })();
    return t;
}
