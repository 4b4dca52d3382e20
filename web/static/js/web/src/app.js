// The web chat page served by `parley serve` at /. It uses the TypeScript
// SDK (sdk/ts) as compiled ES modules; no framework. Tokens: on the
// development key the user picks a name and POST /v1/dev/token mints one;
// otherwise the embedding application passes one as /#token=<JWT>.
import { Client, StoragePositions, } from "../../sdk/ts/src/index.js";
const $ = (id) => document.getElementById(id);
let client;
let me = "";
const convs = new Map();
const outbox = new Map(); // conv → client_msg_id → pending send
let current = null;
let editing = null;
/** A recall asked for and not yet confirmed (the second click within 5 s recalls). */
let recallAsk = null;
/** This page load is a reload of the tab: the open conversation is restored once. */
let reloaded = performance.getEntriesByType("navigation")[0]?.type === "reload";
const typingUntil = new Map(); // conv/user → until
const presence = new Map();
let lastTypingSent = 0;
const uploads = new Map();
let uploadSeq = 0;
// The rendered attachment of each file message (conv/seq), kept across
// renders so that an image does not reload and a playing audio goes on.
const fileViews = new Map();
// Signed URLs (conv/seq/thumb) until shortly before they expire.
const urls = new Map();
/** The E2E module, this tab's device and chat; null when this tab does not own the browser's device (or the browser lacks IndexedDB / Web Locks). */
let e2e = null;
let e2eMod = null;
/** Settles once this tab's E2E device is open (or known to be off): messages wait for it. */
let e2eInit = Promise.resolve();
/** Messages are opened one at a time, in the order they arrive (ratchets advance in order). */
let pipe = Promise.resolve();
/** Account key changes and refused devices seen, by user, until dismissed. */
const identityAlerts = new Map();
let recorder = null;
function deviceId() {
    let d = sessionStorage.getItem("parley.device");
    if (!d) {
        d = "web-" + Math.random().toString(36).slice(2, 10);
        sessionStorage.setItem("parley.device", d);
    }
    return d;
}
function tokenUser(token) {
    try {
        const p = token.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
        return JSON.parse(atob(p)).sub ?? "";
    }
    catch {
        return "";
    }
}
/**
 * claimDevice: this browser profile's E2E device for user (its id kept in
 * localStorage, its keys in IndexedDB) if this tab gets the device's Web
 * Lock within 2 s (a reloaded tab waits for its previous page to let go);
 * the lock is held while the tab lives, so one tab at a time advances the
 * device's ratchets. Another tab of the profile gets null and runs as a
 * plain device of its own.
 */
async function claimDevice(mod, user) {
    if (!navigator.locks || !window.indexedDB)
        return null;
    const k = `parley.e2ee.device.${user}`;
    let id = localStorage.getItem(k);
    if (!id) {
        id = "web-" + Math.random().toString(36).slice(2, 10);
        localStorage.setItem(k, id);
    }
    const name = `${user}/${id}`;
    return new Promise((resolve) => {
        mod.withDeviceLock(name, () => {
            resolve(name.slice(user.length + 1));
            return new Promise(() => { }); // held until the tab goes
        }, { signal: AbortSignal.timeout(2000) }).catch(() => resolve(null));
    });
}
async function loadE2E() {
    const url = "/web/js/e2ee.js";
    try {
        return (await import(url));
    }
    catch (e) {
        console.warn("end-to-end encryption unavailable:", e);
        return null;
    }
}
async function boot() {
    const frag = new URLSearchParams(location.hash.slice(1));
    let token = frag.get("token") ?? sessionStorage.getItem("parley.token") ?? "";
    // #conv=<id>: a notification's click opened this tab on that conversation.
    const conv = frag.get("conv");
    if (conv) {
        sessionStorage.setItem("parley.open", conv);
        reloaded = true;
    }
    if (frag.has("token") || conv)
        history.replaceState(null, "", location.pathname);
    if (!token)
        token = await login();
    sessionStorage.setItem("parley.token", token);
    e2eMod = await loadE2E();
    const user = tokenUser(token);
    const owned = e2eMod ? await claimDevice(e2eMod, user) : null;
    start(token, owned);
}
function login() {
    $("login").hidden = false;
    $("login-name").focus();
    return new Promise((resolve) => {
        $("login-form").addEventListener("submit", async (ev) => {
            ev.preventDefault();
            const user = $("login-name").value.trim();
            const r = await fetch("/v1/dev/token", { method: "POST", body: JSON.stringify({ user }) });
            if (r.status === 404) {
                $("login-note").textContent = "This server uses production keys: open this page from your application with /#token=<JWT>.";
                return;
            }
            const body = await r.json();
            if (!r.ok) {
                $("login-note").textContent = body.error ?? `error ${r.status}`;
                return;
            }
            $("login").hidden = true;
            resolve(body.token);
        });
    });
}
function start(token, owned) {
    me = tokenUser(token);
    $("app").hidden = false;
    $("me").textContent = me;
    const device = owned ?? deviceId();
    client = new Client({
        url: location.origin, token, device,
        positions: new StoragePositions(localStorage, `parley.pos.${me}.${device}`),
    });
    let countdown = null;
    const status = (state, text) => {
        const s = $("status");
        s.dataset.state = state;
        s.textContent = text;
        $("retry").hidden = state !== "reconnecting";
    };
    client.on("connected", ({ transport }) => {
        if (countdown)
            clearInterval(countdown);
        status("connected", transport === "http" ? "Connected (HTTP fallback)" : "Connected");
        renderComposerTools();
        void refreshList();
        void publishE2E();
        void refreshPush();
    });
    client.on("disconnected", () => status("reconnecting", "Disconnected"));
    client.on("draining", () => status("draining", "Server restarting: moving to another connection…"));
    client.on("reconnecting", ({ at }) => {
        if (countdown)
            clearInterval(countdown);
        const tick = () => {
            const s = Math.max(0, Math.ceil((at - Date.now()) / 1000));
            status("reconnecting", s > 0 ? `Reconnecting in ${s}s…` : "Reconnecting…");
        };
        tick();
        countdown = setInterval(tick, 250);
    });
    client.on("stopped", ({ reason }) => {
        status("stopped", `Stopped: ${reason}`);
        if (/unauthorized|token_expired/.test(reason)) {
            sessionStorage.removeItem("parley.token");
        }
    });
    client.on("snapshot", ({ convId, snapshot }) => {
        const c = convs.get(convId);
        if (!c)
            return;
        c.lastSeq = Math.max(c.lastSeq, snapshot.last_seq);
        c.readSeq = Math.max(c.readSeq, snapshot.read_seq);
        renderList();
    });
    client.on("message", ({ convId, message }) => {
        pipe = pipe.then(async () => onMessage(convId, await reveal(convs.get(convId), message)));
    });
    client.on("receipt", onReceipt);
    client.on("typing", ({ convId, userId }) => {
        typingUntil.set(`${convId}/${userId}`, Date.now() + 3000);
        renderTyping();
        setTimeout(renderTyping, 3100);
    });
    client.on("presence", (states) => {
        for (const s of states)
            presence.set(s.user_id, s);
        renderPresence();
        renderList();
    });
    wire();
    e2eInit = startE2E(owned);
    client.start();
}
async function startE2E(owned) {
    const mod = e2eMod;
    if (!mod || !owned) {
        e2eStatus(mod ? "End-to-end encryption is off in this tab: another tab of this browser holds this device's keys. Encrypted conversations open there; this tab takes over when that one closes." : "End-to-end encryption is not available in this browser.");
        const id = localStorage.getItem(`parley.e2ee.device.${me}`);
        if (mod && id && navigator.locks) {
            // Follow the owner: once its tab is gone, reload as the device's tab.
            void mod.withDeviceLock(`${me}/${id}`, async () => { location.reload(); }).catch(() => { });
        }
        return;
    }
    try {
        const store = await mod.IDBStore.open(`parley-e2ee/${me}/${owned}`);
        const device = await mod.Device.open(store, { user: me, device: owned });
        const chat = new mod.E2EChat(client, device);
        chat.onIdentity = (ev) => noteIdentity(ev);
        chat.onKT = (ev) => {
            identityAlerts.set(ev.user, `⚠ The server's key transparency proof for ${ev.user} does not verify (${ev.error.message}): it may be showing keys ${ev.user}'s devices did not publish. Nothing was encrypted to them.`);
            renderBanner();
        };
        e2e = { m: mod, device, chat, published: !!(await store.load("web/published")) };
        for (const id of ["e2e-direct", "e2e-group"])
            $(id).closest("label").hidden = false;
        $("search-form").hidden = false;
        e2eStatus(`This browser is your device ${owned}: its keys stay here, in IndexedDB.`);
        if (client.connection)
            await publishE2E();
    }
    catch (e) {
        e2e = null;
        e2eStatus(`End-to-end encryption failed to start: ${e instanceof Error ? e.message : e}`);
    }
}
let publishing = null;
/** Publishes this device's keys with its certificate once, then keeps them fresh (on each connect). */
function publishE2E() {
    if (!e2e || publishing)
        return publishing ?? Promise.resolve();
    const st = e2e;
    publishing = (async () => {
        try {
            if (!st.published) {
                await st.chat.publishKeys(20);
                await st.device.store.batch([{ key: "web/published", value: Uint8Array.of(1) }]);
                st.published = true;
                $("link-form").hidden = true;
                e2eStatus(`This browser is your device ${st.device.self.device}: its keys stay here, in IndexedDB.`);
            }
            await st.chat.maintain();
            $("link-show").hidden = false;
        }
        catch (e) {
            if (e.code === "account_conflict") {
                e2eStatus("Your account already has encrypted devices: link this browser to them to read and send encrypted messages here.");
                $("link-form").hidden = false;
                $("e2e-panel").open = true;
            }
            else {
                e2eStatus(`Publishing this device's keys failed: ${e instanceof Error ? e.message : e}`);
            }
        }
        finally {
            publishing = null;
        }
    })();
    return publishing;
}
function e2eStatus(text) {
    $("e2e-status").textContent = text;
}
const refusedCodes = new Set(["metadata_mismatch", "unbound", "unauthenticated_recall", "uncertified"]);
/**
 * reveal opens a message of an E2E conversation with this device's keys:
 * the decrypted text, a control message (hidden), or a placeholder —
 * "not on this device" for what was never encrypted to it.
 */
async function reveal(c, m) {
    const enc = c?.e2e || (m.body ?? "").startsWith('{"e2e":');
    if (!enc)
        return m;
    await e2eInit;
    if (m.kind === "system") {
        if (e2e) {
            await e2e.chat.open(m).catch(() => { });
            const ev = JSON.parse(m.body ?? "{}");
            // A changed identity or a new device: read the list now (the banner shows a changed account key).
            if (ev.event === "identity_changed" || ev.event === "device_added") {
                for (const u of ev.users ?? [])
                    if (u !== me)
                        void e2e.chat.devices(u, true).catch(() => { });
            }
        }
        return m;
    }
    if (isFile(m))
        return m; // shown as an encrypted attachment's placeholder
    if (!e2e)
        return { ...m, body: "", e2eState: "missing", note: "🔒 Encrypted: open this conversation in the tab that holds this device's keys" };
    try {
        const o = await e2e.chat.open(m);
        if (o.control)
            return { ...m, control: true };
        return { ...m, body: o.text ?? "", recalled: m.recalled || o.recalled };
    }
    catch (e) {
        const code = e.code ?? "";
        if (refusedCodes.has(code))
            return { ...m, body: "", e2eState: "refused", note: `⚠ Refused: ${e.message}` };
        return { ...m, body: "", e2eState: "missing", note: "🔒 Not on this device: sent before this device was added, or not encrypted to it" };
    }
}
/** Opens a page of history in order. */
async function revealAll(c, msgs) {
    const out = [];
    await (pipe = pipe.then(async () => {
        for (const m of [...msgs].sort((a, b) => a.seq - b.seq))
            out.push(await reveal(c, m));
    }));
    return out;
}
function noteIdentity(ev) {
    if (ev.check.change) {
        identityAlerts.set(ev.user, `⚠ ${ev.user}'s safety number changed: ${ev.user} set up encryption again (a new account key) — or someone is in the middle. Compare the new safety number before you trust it.`);
    }
    else if (ev.check.refused.length) {
        identityAlerts.set(ev.user, `⚠ ${ev.check.refused.length} device(s) of ${ev.user} were refused: not certified by ${ev.user}'s account key. Messages are not encrypted to them.`);
    }
    renderBanner();
}
function renderBanner() {
    const c = current;
    const users = !c ? [] : c.kind === "direct" ? [c.peer ?? ""] : [...identityAlerts.keys()];
    const u = users.find((x) => identityAlerts.has(x));
    $("identity-banner").hidden = !u || !c?.e2e;
    $("identity-banner").dataset.user = u ?? "";
    $("identity-text").textContent = u ? identityAlerts.get(u) : "";
}
/** The safety number view: for a direct chat the peer's, with a QR code; for a group each member's. */
async function showSafety() {
    const c = current;
    if (!c || !e2e)
        return;
    const d = $("safety-dialog");
    $("safety-number").textContent = "…";
    $("safety-qr").replaceChildren();
    d.showModal();
    try {
        if (c.kind === "direct" && c.peer) {
            const n = await e2e.chat.safetyNumber(c.peer);
            $("safety-who").textContent = `You and ${c.peer}:`;
            $("safety-number").textContent = groupDigits(n);
            $("safety-number").dataset.number = n;
            const svg = e2e.m.encodeQR(n, "svg", { ecc: "medium" });
            $("safety-qr").innerHTML = svg;
            $("safety-qr").dataset.number = n;
        }
        else {
            const info = await client.request({ type: "conv_info", conv_id: c.id }, true);
            const lines = [];
            for (const u of info.conv.members.filter((x) => x !== me)) {
                try {
                    lines.push(`${u}:\n${groupDigits(await e2e.chat.safetyNumber(u))}`);
                }
                catch {
                    lines.push(`${u}: no keys seen yet`);
                }
            }
            $("safety-who").textContent = "You and each member of this group:";
            $("safety-number").textContent = lines.join("\n\n");
        }
    }
    catch (e) {
        $("safety-number").textContent = `No safety number yet: ${e instanceof Error ? e.message : e}`;
    }
}
/** 60 digits in 12 groups of 5, three lines of four. */
function groupDigits(n) {
    const g = n.match(/.{1,5}/g) ?? [];
    const lines = [];
    for (let i = 0; i < g.length; i += 4)
        lines.push(g.slice(i, i + 4).join(" "));
    return lines.join("\n");
}
async function search(q) {
    if (!e2e)
        return;
    const hits = await e2e.chat.search(q);
    $("search-hits").replaceChildren(...hits.slice(0, 50).map((h) => {
        const li = document.createElement("li");
        const c = convs.get(h.convId);
        li.append(button(`${c ? (c.kind === "group" ? "# " : "") + c.name : h.convId}: ${h.text}`, `Open the message in ${c?.name ?? h.convId}`, () => void openConv(h.convId, true)));
        return li;
    }));
    if (!hits.length) {
        const li = document.createElement("li");
        li.textContent = "No message on this device matches.";
        $("search-hits").replaceChildren(li);
    }
}
/** The query and cursor of the shown server search results. */
let msearch = null;
/**
 * Searches the plain conversations on the server (end-to-end encrypted
 * ones are searched on the device, above). more: the next page of the
 * same query.
 */
async function serverSearch(text, more = false) {
    const status = $("msearch-status");
    const hits = $("msearch-hits");
    if (!more)
        msearch = { text };
    const q = msearch;
    let r;
    try {
        r = await client.search({ text: q.text, limit: 20, ...(more && q.cursor ? { cursor: q.cursor } : {}) });
    }
    catch (e) {
        status.hidden = false;
        status.textContent = e.code === "search_unavailable"
            ? "Search is not available on this server."
            : `Search failed: ${e instanceof Error ? e.message : e}`;
        if (!more)
            hits.replaceChildren();
        return;
    }
    if (msearch !== q)
        return; // a newer search started meanwhile
    q.cursor = r.cursor;
    const items = r.hits.map((h) => {
        const li = document.createElement("li");
        const c = convs.get(h.conv_id);
        const where = document.createElement("span");
        where.className = "where";
        where.textContent = `${c ? (c.kind === "group" ? "# " : "") + c.name : h.conv_id} · ${h.sender} · ${new Date(h.server_time).toLocaleString()}`;
        const snip = document.createElement("span");
        snip.className = "snippet";
        let at = 0;
        for (const [start, end] of h.highlights) {
            if (start < at || end <= start)
                continue;
            snip.append(h.snippet.slice(at, start));
            const mark = document.createElement("mark");
            mark.textContent = h.snippet.slice(start, end);
            snip.append(mark);
            at = end;
        }
        snip.append(h.snippet.slice(at));
        const b = document.createElement("button");
        b.type = "button";
        b.append(where, snip);
        b.addEventListener("click", () => void openAt(h.conv_id, h.seq).catch(alertError));
        li.append(b);
        return li;
    });
    if (more) {
        hits.querySelector("li.more")?.remove();
        hits.append(...items);
    }
    else
        hits.replaceChildren(...items);
    if (r.cursor) {
        const li = document.createElement("li");
        li.className = "more";
        li.append(button("More results", "Show more search results", () => void serverSearch(q.text, true)));
        hits.append(li);
    }
    status.hidden = items.length > 0 || more;
    status.textContent = items.length || more ? "" : `No message matches “${q.text}”.`;
}
/** How far back (in seqs) a search result is loaded to be shown in place. */
const maxJump = 2000;
/** Opens a conversation scrolled to message seq, loading it if needed. */
async function openAt(convId, seq) {
    if (!convs.has(convId))
        await refreshList();
    await openConv(convId, false);
    const c = convs.get(convId);
    if (!c)
        return;
    if (!c.msgs.has(seq)) {
        const shownFrom = c.oldest || c.lastSeq + 1;
        if (shownFrom - seq > maxJump) {
            const status = $("msearch-status");
            status.hidden = false;
            status.textContent = `That message is ${shownFrom - seq} messages back: scroll up in the conversation to reach it.`;
            return;
        }
        // Load the page around it, then the gap up to what is shown.
        const page = await client.history(convId, { beforeSeq: seq + 1, limit: 30 });
        for (const m of await revealAll(c, page.messages))
            addMessage(c, m);
        let from = seq;
        const shown = [...c.msgs.keys()].filter((s) => s > seq).sort((a, b) => a - b)[0];
        while (shown && from < shown - 1) {
            const next = await client.history(convId, { afterSeq: from, limit: 100 });
            if (!next.messages.length)
                break;
            for (const m of await revealAll(c, next.messages))
                addMessage(c, m);
            from = next.messages[next.messages.length - 1].seq;
        }
        c.hasOlder = page.hasMore;
        renderMessages(false);
    }
    const li = $("messages").querySelector(`li[data-seq="${seq}"]`);
    if (!li)
        return;
    $("messages").querySelectorAll("li.found").forEach((e) => e.classList.remove("found"));
    li.classList.add("found");
    li.scrollIntoView({ block: "center" });
}
function fromSummary(s) {
    const old = convs.get(s.conv_id);
    const c = old ?? {
        id: s.conv_id, kind: s.kind, name: "", lastSeq: 0, readSeq: 0, joinSeq: 0, mentioned: false,
        msgs: new Map(), loaded: false, oldest: 0, hasOlder: false, peerDelivered: 0, peerRead: 0, e2e: false,
        lastAt: 0, preview: "",
    };
    c.e2e = c.e2e || !!s.e2e;
    c.kind = s.kind;
    c.peer = s.peer;
    c.name = s.kind === "direct" ? (s.peer ?? "?") : (s.name || "group");
    c.lastSeq = Math.max(c.lastSeq, s.leave_seq || s.last_seq);
    c.readSeq = Math.max(c.readSeq, s.read_seq);
    // The peer's positions as the list knows them: a tab that missed the
    // receipts (opened later, reloaded) still shows delivered and read.
    c.peerRead = Math.max(c.peerRead, s.peer_read_seq ?? 0);
    c.peerDelivered = Math.max(c.peerDelivered, s.peer_delivered_seq ?? 0, c.peerRead);
    c.joinSeq = s.join_seq;
    if (s.last_message)
        noteLast(c, s.last_message);
    c.mentioned = !!s.mentioned && c.readSeq < c.lastSeq;
    convs.set(c.id, c);
    return c;
}
async function refreshList() {
    const list = await client.conversations();
    for (const s of list)
        fromSummary(s);
    renderList();
    watchPeers();
    if (current)
        void openConv(current.id, false);
    else if (reloaded) {
        // After a reload (not a visit from elsewhere, which shows the list
        // and its unread counts), the conversation this tab had open.
        reloaded = false;
        const open = sessionStorage.getItem("parley.open");
        if (open && convs.has(open))
            void openConv(open, false);
    }
}
/** Remembers m as c's newest message for the list, if it is. */
function noteLast(c, m) {
    if (m.kind === "state" || m.server_time < c.lastAt)
        return;
    c.lastAt = m.server_time;
    c.preview = previewOf(c, m);
}
/** One line of m for the conversation list. */
function previewOf(c, m) {
    const who = c.kind === "group" && m.kind !== "system" ? `${m.sender === me ? "you" : m.sender}: ` : m.sender === me ? "you: " : "";
    if (m.recalled)
        return who + "message recalled";
    if (m.kind === "system")
        return systemText(m);
    if (isFile(m))
        return who + "📎 " + (fileBody(m)?.name || "file");
    if ((m.body ?? "").startsWith('{"e2e":'))
        return who + "🔒 encrypted message";
    return who + (m.body ?? "").replace(/\s+/g, " ").slice(0, 80);
}
/** Watches the presence of every direct peer (the server allows at most 200). */
function watchPeers() {
    const peers = [...convs.values()].filter((c) => c.kind === "direct" && c.peer).map((c) => c.peer);
    if (!peers.length)
        return;
    client.watchPresence(peers.slice(0, 200)).then((st) => {
        for (const s of st)
            presence.set(s.user_id, s);
        renderPresence();
        renderList();
    }, () => { });
}
function unread(c) {
    return Math.max(0, c.lastSeq - Math.max(c.readSeq, c.joinSeq - 1));
}
function renderList() {
    const ul = $("convs");
    const sorted = [...convs.values()].sort((a, b) => lastTime(b) - lastTime(a));
    ul.replaceChildren(...sorted.map((c) => {
        const li = document.createElement("li");
        const b = document.createElement("button");
        b.type = "button";
        b.dataset.conv = c.id;
        b.setAttribute("aria-current", String(current?.id === c.id));
        const n = unread(c);
        const online = c.peer && presence.get(c.peer)?.online ? " ●" : "";
        b.setAttribute("aria-label", `${c.kind === "group" ? "Group" : "Chat with"} ${c.name}${n ? `, ${n} unread` : ""}${c.mentioned ? ", mentioned" : ""}`);
        const name = document.createElement("span");
        name.className = "name";
        name.textContent = (c.kind === "group" ? "# " : "") + c.name + online;
        const text = document.createElement("span");
        text.className = "entry";
        const preview = document.createElement("span");
        preview.className = "preview";
        preview.textContent = c.preview;
        text.append(name, preview);
        if (c.e2e) {
            const lock = document.createElement("span");
            lock.className = "lock";
            lock.textContent = "🔒";
            lock.title = "End-to-end encrypted";
            b.append(lock);
        }
        b.append(text);
        if (c.mentioned)
            b.append(badge("@", "badge mention"));
        if (n > 0)
            b.append(badge(String(n), "badge unread"));
        b.addEventListener("click", () => void openConv(c.id, true));
        li.append(b);
        return li;
    }));
}
/** When c last had a message: the list shows the most recent first. */
function lastTime(c) {
    let t = c.lastAt;
    for (const m of c.msgs.values())
        t = Math.max(t, m.server_time);
    return t;
}
function badge(text, cls) {
    const s = document.createElement("span");
    s.className = cls;
    s.textContent = text;
    s.setAttribute("aria-hidden", "true");
    return s;
}
async function openConv(id, focus) {
    const c = convs.get(id);
    if (!c)
        return;
    current = c;
    sessionStorage.setItem("parley.open", id);
    $("app").classList.add("open");
    $("chat").hidden = false;
    $("empty").hidden = true;
    $("title").textContent = (c.kind === "group" ? "# " : "") + c.name;
    $("add-members").hidden = c.kind !== "group";
    $("remove-members").hidden = c.kind !== "group";
    $("lock").hidden = !c.e2e;
    $("lock-label").textContent = c.e2e
        ? "End-to-end encrypted: only the members' devices can read the messages. The server sees who talks with whom and when, the size of each message and the group's members — not what is said."
        : "";
    $("safety").hidden = !c.e2e || !e2e;
    renderBanner();
    renderComposerTools();
    renderUploads();
    renderList();
    renderPresence();
    if (!c.loaded) {
        const page = await client.history(id, { limit: 30 });
        for (const m of await revealAll(c, page.messages))
            addMessage(c, m);
        c.hasOlder = page.hasMore;
        c.loaded = true;
    }
    renderMessages(true);
    markRead(c);
    if (focus)
        $("text").focus();
}
async function loadOlder() {
    const c = current;
    if (!c || !c.hasOlder || !c.oldest)
        return;
    c.hasOlder = false; // one page at a time
    const list = $("messages");
    const before = list.scrollHeight;
    const page = await client.history(c.id, { beforeSeq: c.oldest, limit: 30 });
    for (const m of await revealAll(c, page.messages))
        addMessage(c, m);
    c.hasOlder = page.hasMore;
    renderMessages(false);
    list.scrollTop = list.scrollHeight - before;
}
function markRead(c) {
    if (current !== c || document.hidden || unread(c) === 0)
        return;
    const seq = c.lastSeq;
    c.readSeq = seq;
    c.mentioned = false;
    renderList();
    client.read(c.id, seq).catch(() => { });
}
/** Records a message (or applies an edit/recall event) in the conversation. */
function addMessage(c, m) {
    if (c.oldest === 0 || m.seq < c.oldest)
        c.oldest = m.seq;
    if ((m.kind === "edit" || m.kind === "recall") && m.target_seq) {
        const t = c.msgs.get(m.target_seq);
        if (t) {
            if (m.kind === "edit") {
                t.body = m.body;
                t.edited = true;
            }
            else {
                t.body = "";
                t.recalled = true;
                fileViews.delete(`${c.id}/${t.seq}`);
            }
        }
        c.msgs.set(m.seq, m);
        return;
    }
    if (m.kind === "state" && m.coalesce_key) {
        for (const o of c.msgs.values())
            if (o.kind === "state" && o.coalesce_key === m.coalesce_key && o.seq < m.seq)
                o.superseded = true;
    }
    c.msgs.set(m.seq, m);
    if (m.client_msg_id)
        outbox.get(c.id)?.delete(m.client_msg_id);
}
function onMessage(convId, m) {
    let c = convs.get(convId);
    if (!c) {
        c = fromSummary({ conv_id: convId, kind: "group", last_seq: 0, read_seq: 0, join_seq: 0, unread: 0 });
        void refreshList();
    }
    c.lastSeq = Math.max(c.lastSeq, m.seq);
    noteLast(c, m);
    if (m.sender === me)
        c.readSeq = Math.max(c.readSeq, m.seq);
    else if (m.mention_all || m.mentions?.includes(me))
        c.mentioned = true;
    if (c.loaded)
        addMessage(c, m);
    if (typingUntil.delete(`${convId}/${m.sender}`))
        renderTyping();
    if (c === current) {
        renderMessages(nearBottom());
        markRead(c);
    }
    renderList();
}
function onReceipt(r) {
    const c = convs.get(r.conv_id);
    if (!c)
        return;
    if (r.user_id === me) {
        if (r.state === "read" && r.seq > c.readSeq) {
            // Read on another device of mine: clear the badge here too.
            c.readSeq = r.seq;
            if (c.readSeq >= c.lastSeq)
                c.mentioned = false;
            renderList();
        }
        return;
    }
    if (r.state === "delivered")
        c.peerDelivered = Math.max(c.peerDelivered, r.seq);
    else
        c.peerRead = Math.max(c.peerRead, r.seq);
    c.peerDelivered = Math.max(c.peerDelivered, c.peerRead);
    if (c === current)
        renderMessages(nearBottom());
}
function nearBottom() {
    const l = $("messages");
    return l.scrollHeight - l.scrollTop - l.clientHeight < 80;
}
function stateOf(c, m) {
    if (c.kind !== "direct")
        return "stored";
    if (c.peerRead >= m.seq)
        return "read";
    if (c.peerDelivered >= m.seq)
        return "delivered";
    return "stored";
}
function systemText(m) {
    try {
        const e = JSON.parse(m.body ?? "{}");
        const users = (e.users ?? []).join(", ");
        switch (e.event) {
            case "member_added": return `${e.actor} added ${users}`;
            case "member_removed": return `${e.actor} removed ${users}`;
            case "member_left": return `${users} left`;
            case "role_changed": return `${e.actor} made ${users} ${e.role}`;
            case "muted": return `${e.actor} muted ${users}`;
            case "unmuted": return `${e.actor} unmuted ${users}`;
            case "device_added": return `${e.actor} added a device${e.device ? ` (${e.device})` : ""}`;
            case "device_removed": return `${e.actor} removed a device${e.device ? ` (${e.device})` : ""}`;
            case "identity_changed": return `${users || e.actor} set up encryption again: the safety number changed`;
        }
    }
    catch { /* fall through */ }
    return m.body ?? "";
}
function renderMessages(stick) {
    const c = current;
    if (!c)
        return;
    const list = $("messages");
    const items = [];
    const seqs = [...c.msgs.keys()].sort((a, b) => a - b);
    for (const seq of seqs) {
        const m = c.msgs.get(seq);
        if (m.kind === "edit" || m.kind === "recall" || m.superseded || m.control)
            continue;
        const li = document.createElement("li");
        li.dataset.seq = String(m.seq);
        if (m.kind === "system") {
            li.className = "system";
            li.textContent = systemText(m);
            items.push(li);
            continue;
        }
        const mine = m.sender === me;
        if (mine)
            li.classList.add("mine");
        const body = document.createElement("div");
        body.className = "body" + (m.recalled ? " recalled" : "");
        if (m.recalled)
            body.textContent = "message recalled";
        else if (m.e2eState) {
            body.classList.add(m.e2eState);
            body.textContent = m.note ?? "";
        }
        else if (isFile(m))
            body.append(fileView(c, m));
        else
            body.textContent = (m.kind === "state" ? `[${m.coalesce_key}] ` : "") + (m.body ?? "");
        const meta = document.createElement("div");
        meta.className = "meta";
        const who = document.createElement("span");
        who.textContent = `${m.sender} · ${new Date(m.server_time).toLocaleTimeString()}${m.edited ? " · edited" : ""}`;
        meta.append(who);
        if (mine) {
            const st = document.createElement("span");
            st.className = "state";
            st.textContent = stateOf(c, m);
            meta.append(st);
            if (m.kind === "text" && !m.recalled && !m.e2eState)
                meta.append(button("Edit", `Edit message ${m.seq}`, () => startEdit(c, m)));
            if ((m.kind === "text" || isFile(m)) && !m.recalled) {
                const asked = recallAsk && recallAsk.conv === c.id && recallAsk.seq === m.seq && recallAsk.until > Date.now();
                meta.append(asked
                    ? button("Recall for everyone?", `Confirm: recall message ${m.seq} for everyone`, () => {
                        recallAsk = null;
                        void (c.e2e ? e2eOf(c).then((x) => x.chat.recall(c.id, m.seq)) : client.recall(c.id, m.seq)).catch(alertError);
                    })
                    : button("Recall", `Recall message ${m.seq}`, () => {
                        // Deleting for everyone cannot be undone: ask once more.
                        recallAsk = { conv: c.id, seq: m.seq, until: Date.now() + 5000 };
                        renderMessages(false);
                        setTimeout(() => { if (recallAsk?.seq === m.seq && recallAsk.until <= Date.now()) {
                            recallAsk = null;
                            if (current === c)
                                renderMessages(false);
                        } }, 5100);
                    }));
            }
        }
        li.append(body, meta);
        items.push(li);
    }
    for (const o of outbox.get(c.id)?.values() ?? []) {
        const li = document.createElement("li");
        li.className = "mine pending";
        li.dataset.cmid = o.cmid;
        li.innerHTML = `<div class="body"></div><div class="meta"><span class="state"></span></div>`;
        li.querySelector(".body").textContent = o.body;
        li.querySelector(".state").textContent = o.state;
        items.push(li);
    }
    list.replaceChildren(...items);
    if (stick)
        list.scrollTop = list.scrollHeight;
}
function button(text, label, fn) {
    const b = document.createElement("button");
    b.type = "button";
    b.textContent = text;
    b.setAttribute("aria-label", label);
    b.addEventListener("click", fn);
    return b;
}
function startEdit(c, m) {
    editing = { conv: c.id, seq: m.seq };
    $("editing").hidden = false;
    const t = $("text");
    t.value = m.body ?? "";
    t.focus();
}
function stopEdit() {
    editing = null;
    $("editing").hidden = true;
}
function alertError(e) {
    $("typing").textContent = `Error: ${e instanceof Error ? e.message : e}`;
}
function renderTyping() {
    const c = current;
    const now = Date.now();
    const who = c ? [...typingUntil].filter(([k, until]) => k.startsWith(c.id + "/") && until > now).map(([k]) => k.split("/")[1]) : [];
    $("typing").textContent = who.length ? `${who.join(", ")} ${who.length > 1 ? "are" : "is"} typing…` : "";
}
function renderPresence() {
    const c = current;
    const p = c?.peer ? presence.get(c.peer) : undefined;
    $("presence").textContent = !p ? "" : p.online ? "online" : p.last_seen ? `last seen ${new Date(p.last_seen).toLocaleTimeString()}` : "offline";
}
async function submit() {
    const c = current;
    const t = $("text");
    const body = t.value.trim();
    if (!c || !body)
        return;
    t.value = "";
    if (editing && editing.conv === c.id) {
        const seq = editing.seq;
        stopEdit();
        if (c.e2e) {
            await e2eOf(c).then(async (x) => {
                await x.chat.edit(c.id, seq, body);
                const t = c.msgs.get(seq);
                if (t) {
                    t.body = body;
                    t.edited = true;
                    renderMessages(false);
                }
            }).catch(alertError);
        }
        else
            await client.edit(c.id, seq, body).catch(alertError);
        return;
    }
    const mentions = [...body.matchAll(/@([A-Za-z0-9._@-]+)/g)].map((x) => x[1]).filter((u) => u !== "everyone" && u !== me);
    const cmid = crypto.randomUUID();
    let box = outbox.get(c.id);
    if (!box)
        outbox.set(c.id, (box = new Map()));
    box.set(cmid, { cmid, body, state: "sending" });
    renderMessages(true);
    try {
        // E2E: encrypted to every device of the members (no mentions: the server would see them).
        const ack = c.e2e ? await e2eOf(c).then((x) => x.chat.send(c.id, body)) : await client.send(c.id, body, {
            clientMsgId: cmid,
            mentions: c.kind === "group" ? mentions : undefined,
            mentionAll: c.kind === "group" && /@everyone\b/.test(body),
        });
        box.delete(cmid);
        c.lastSeq = Math.max(c.lastSeq, ack.seq);
        if (c.loaded && !c.msgs.has(ack.seq)) {
            addMessage(c, { conv_id: c.id, seq: ack.seq, msg_id: ack.msg_id, sender: me, kind: "text", body, client_msg_id: cmid, server_time: ack.server_time });
        }
    }
    catch (e) {
        const o = box.get(cmid);
        if (o)
            o.state = "failed";
        alertError(e);
    }
    if (current === c)
        renderMessages(true);
}
/** This tab's E2E state for conversation c, or an error saying why it cannot encrypt. */
async function e2eOf(c) {
    if (!e2e)
        throw new Error(`${c.name} is end-to-end encrypted and this tab does not hold this device's keys`);
    await publishE2E();
    if (!e2e.published)
        throw new Error("this device's keys are not published yet (see Encryption on this device)");
    return e2e;
}
function wire() {
    $("new-direct").addEventListener("submit", async (ev) => {
        ev.preventDefault();
        const peer = $("peer");
        try {
            const enc = !!e2e && $("e2e-direct").checked;
            const info = await client.openDirect(peer.value.trim(), { e2e: enc });
            fromSummary({ conv_id: info.conv_id, kind: "direct", peer: peer.value.trim(), last_seq: info.last_seq, read_seq: 0, join_seq: info.join_seq, unread: 0, e2e: info.e2e });
            peer.value = "";
            watchPeers();
            await openConv(info.conv_id, true);
        }
        catch (e) {
            alertError(e);
        }
    });
    $("new-group").addEventListener("submit", async (ev) => {
        ev.preventDefault();
        const name = $("group-name"), members = $("group-members");
        try {
            const enc = !!e2e && $("e2e-group").checked;
            const info = await client.createGroup(name.value.trim(), split(members.value), { e2e: enc });
            fromSummary({ conv_id: info.conv_id, kind: "group", name: info.name, last_seq: info.last_seq, read_seq: info.last_seq, join_seq: info.join_seq, unread: 0, e2e: info.e2e });
            name.value = members.value = "";
            await openConv(info.conv_id, true);
        }
        catch (e) {
            alertError(e);
        }
    });
    $("add-members").addEventListener("submit", async (ev) => {
        ev.preventDefault();
        const input = $("add-input");
        if (!current)
            return;
        try {
            await client.addMembers(current.id, split(input.value));
            input.value = "";
        }
        catch (e) {
            alertError(e);
        }
    });
    $("remove-members").addEventListener("submit", async (ev) => {
        ev.preventDefault();
        const input = $("remove-input");
        if (!current)
            return;
        try {
            await client.removeMembers(current.id, split(input.value));
            input.value = "";
        }
        catch (e) {
            alertError(e);
        }
    });
    $("composer").addEventListener("submit", (ev) => { ev.preventDefault(); void submit(); });
    const text = $("text");
    text.addEventListener("keydown", (ev) => {
        if (ev.key === "Enter" && !ev.shiftKey) {
            ev.preventDefault();
            void submit();
        }
        if (ev.key === "Escape" && editing) {
            stopEdit();
            text.value = "";
        }
    });
    text.addEventListener("input", () => {
        if (current && Date.now() - lastTypingSent > 2000) {
            lastTypingSent = Date.now();
            client.typing(current.id);
        }
    });
    $("cancel-edit").addEventListener("click", () => { stopEdit(); text.value = ""; text.focus(); });
    $("back").addEventListener("click", () => {
        $("app").classList.remove("open");
        current = null;
        sessionStorage.removeItem("parley.open");
        renderList();
        $("peer").focus();
    });
    $("retry").addEventListener("click", () => client.reconnectNow());
    $("notify").addEventListener("click", () => void togglePush());
    $("signout").addEventListener("click", () => void signOut());
    // A click on a notification while this tab is open: the service worker names the conversation.
    navigator.serviceWorker?.addEventListener("message", (ev) => {
        const d = ev.data;
        if (d?.type === "open" && d.conv && convs.has(d.conv))
            void openConv(d.conv, true);
    });
    $("messages").addEventListener("scroll", () => { if ($("messages").scrollTop < 40)
        void loadOlder(); });
    document.addEventListener("visibilitychange", () => { if (current)
        markRead(current); });
    wireAttachments();
    wireE2E();
}
function wireE2E() {
    $("safety").addEventListener("click", () => void showSafety());
    $("safety-close").addEventListener("click", () => $("safety-dialog").close());
    $("identity-show").addEventListener("click", () => void showSafety());
    $("identity-dismiss").addEventListener("click", () => {
        identityAlerts.delete($("identity-banner").dataset.user ?? "");
        renderBanner();
    });
    $("link-show").addEventListener("click", async () => {
        if (!e2e)
            return;
        const code = $("link-code");
        code.value = (await e2e.device.exportAccountKey()).trim();
        code.hidden = false;
        code.select();
    });
    $("link-form").addEventListener("submit", async (ev) => {
        ev.preventDefault();
        if (!e2e)
            return;
        const input = $("link-input");
        try {
            await e2e.device.importAccountKey(input.value.trim() + "\n");
            input.value = "";
            await publishE2E();
        }
        catch (e) {
            e2eStatus(`Linking failed: ${e instanceof Error ? e.message : e}`);
        }
    });
    $("msearch-form").addEventListener("submit", (ev) => {
        ev.preventDefault();
        void serverSearch($("msearch-input").value.trim());
    });
    $("search-form").addEventListener("submit", (ev) => {
        ev.preventDefault();
        void search($("search-input").value.trim()).catch(alertError);
    });
}
// --- attachments ------------------------------------------------------------
const safeImages = new Set(["image/png", "image/jpeg", "image/gif", "image/webp"]);
function isFile(m) { return m.kind === "file"; }
/** The FileBody of a file message of a plain conversation, or null when the body is not one. */
function fileBody(m) {
    try {
        const b = JSON.parse(m.body ?? "");
        if (b && typeof b === "object" && typeof b.name === "string" && typeof b.media_type === "string" && typeof b.size === "number")
            return b;
    }
    catch { /* not JSON: an envelope or something else this page cannot read */ }
    return null;
}
function humanSize(n) {
    if (n < 1024)
        return `${n} B`;
    const units = ["KB", "MB", "GB"];
    let v = n / 1024, i = 0;
    while (v >= 1024 && i < units.length - 1) {
        v /= 1024;
        i++;
    }
    return `${v < 10 ? v.toFixed(1) : Math.round(v)} ${units[i]}`;
}
function clock(ms) {
    const s = Math.round(ms / 1000);
    return `${Math.floor(s / 60)}:${String(s % 60).padStart(2, "0")}`;
}
/** A signed URL of the file (or thumbnail) of conv/seq, reused until 30 s before it expires. */
function fileURL(conv, seq, thumbnail) {
    const key = `${conv}/${seq}/${thumbnail ? 1 : 0}`;
    const cached = urls.get(key);
    if (cached)
        return cached;
    const p = client.attachmentUrl(conv, seq, { thumbnail });
    urls.set(key, p);
    p.then((info) => {
        setTimeout(() => { if (urls.get(key) === p)
            urls.delete(key); }, Math.max(0, info.url_expires_at - Date.now() - 30000));
    }, () => urls.delete(key));
    return p;
}
/** The attachment of a file message: an image preview, an audio player, a video, or a download link; a placeholder when unreadable. */
function fileView(c, m) {
    const key = `${c.id}/${m.seq}`;
    const cached = fileViews.get(key);
    if (cached)
        return cached;
    const el = document.createElement("div");
    el.className = "file";
    const fb = c.e2e ? null : fileBody(m);
    if (!fb) {
        el.classList.add("placeholder");
        el.textContent = c.e2e
            ? "Encrypted attachment — this page cannot decrypt it; open it in an app that holds this conversation's keys."
            : "An attachment this page cannot show.";
        fileViews.set(key, el);
        return el;
    }
    const type = fb.media_type.toLowerCase();
    // thumbnail absent: none is made (not an image the server reads, or over the pixel limit: "refused").
    if (safeImages.has(type) && (fb.thumbnail === "pending" || fb.thumbnail === "ready"))
        el.append(imageView(c, m, fb));
    else if (type.startsWith("audio/"))
        el.append(mediaView(c, m, fb, "audio"));
    else if (type.startsWith("video/"))
        el.append(mediaView(c, m, fb, "video"));
    el.append(downloadLink(c, m, fb));
    if (fb.caption) {
        const cap = document.createElement("div");
        cap.className = "caption";
        cap.textContent = fb.caption;
        el.append(cap);
    }
    fileViews.set(key, el);
    return el;
}
/** The thumbnail in a button that opens the full image. */
function imageView(c, m, fb) {
    const b = document.createElement("button");
    b.type = "button";
    b.className = "thumb";
    b.setAttribute("aria-label", `Open image ${fb.name}${fb.width && fb.height ? ` (${fb.width}×${fb.height})` : ""}`);
    const img = document.createElement("img");
    img.alt = fb.name;
    if (fb.width && fb.height) {
        // Reserve the thumbnail's box (320 px on the longest side at most) so the list does not jump when it loads.
        const k = Math.min(1, 320 / Math.max(fb.width, fb.height));
        img.width = Math.max(1, Math.round(fb.width * k));
        img.height = Math.max(1, Math.round(fb.height * k));
    }
    img.dataset.state = "loading";
    img.addEventListener("load", () => { img.dataset.state = "loaded"; });
    img.addEventListener("error", () => { img.dataset.state = "error"; });
    fileURL(c.id, m.seq, true).then((info) => { img.src = info.url; }, () => {
        img.dataset.state = "none";
        b.hidden = true; // no thumbnail (yet or at all): the download link stays
    });
    b.append(img);
    b.addEventListener("click", () => void openViewer(c, m, fb));
    return b;
}
async function openViewer(c, m, fb) {
    const d = $("viewer");
    const img = $("viewer-img");
    $("viewer-title").textContent = fb.name;
    img.alt = fb.name;
    img.removeAttribute("src");
    d.showModal();
    try {
        img.src = (await fileURL(c.id, m.seq, false)).url;
    }
    catch (e) {
        d.close();
        alertError(e);
    }
}
function mediaView(c, m, fb, kind) {
    const wrap = document.createElement("div");
    wrap.className = kind;
    const el = document.createElement(kind);
    el.controls = true;
    el.preload = "metadata";
    el.setAttribute("aria-label", `${kind === "audio" ? "Audio" : "Video"} ${fb.name}${fb.duration_ms ? `, ${clock(fb.duration_ms)}` : ""}`);
    let refreshed = 0;
    const load = () => fileURL(c.id, m.seq, false).then((info) => { el.src = info.url; }, alertError);
    // The URL is short-lived: a player used after it expired asks for a fresh one (once a minute at most).
    el.addEventListener("error", () => {
        if (Date.now() - refreshed < 60000)
            return;
        refreshed = Date.now();
        const at = el.currentTime;
        urls.delete(`${c.id}/${m.seq}/0`);
        void load().then(() => { el.currentTime = at; });
    });
    void load();
    wrap.append(el);
    if (fb.duration_ms) {
        const d = document.createElement("span");
        d.className = "duration";
        d.textContent = clock(fb.duration_ms);
        wrap.append(d);
    }
    return wrap;
}
/** name · size, downloading the file (Content-Disposition names it) with a fresh URL on each click. */
function downloadLink(c, m, fb) {
    const a = document.createElement("a");
    a.className = "download";
    a.href = "#";
    a.textContent = `${fb.name} · ${humanSize(fb.size)}`;
    a.setAttribute("aria-label", `Download ${fb.name}, ${humanSize(fb.size)}`);
    a.addEventListener("click", async (ev) => {
        ev.preventDefault();
        try {
            const info = await fileURL(c.id, m.seq, false);
            const go = document.createElement("a");
            go.href = info.url;
            go.download = fb.name;
            go.rel = "noopener";
            document.body.append(go);
            go.click();
            go.remove();
        }
        catch (e) {
            alertError(e);
        }
    });
    return a;
}
/** Attach and record are there while the server takes files and the conversation is not end-to-end encrypted (the page cannot encrypt). */
function renderComposerTools() {
    const lim = client?.attachmentLimits;
    const on = !!lim && lim.maxFileBytes > 0;
    const e2e = !!current?.e2e;
    $("attach").hidden = !on;
    $("record").hidden = !on || !navigator.mediaDevices?.getUserMedia || typeof MediaRecorder === "undefined";
    for (const id of ["attach", "record"])
        $(id).disabled = e2e;
    $("attach").title = e2e ? "This page cannot encrypt files for an end-to-end encrypted conversation" : "";
}
function canAttach(c, size) {
    if (!c)
        return false;
    if (c.e2e) {
        alertError("this conversation is end-to-end encrypted: this page cannot encrypt files");
        return false;
    }
    const lim = client.attachmentLimits;
    if (!lim || lim.maxFileBytes === 0) {
        alertError("this server does not take files");
        return false;
    }
    if (size > lim.maxFileBytes) {
        alertError(`the file is ${humanSize(size)}; this server takes at most ${humanSize(lim.maxFileBytes)}`);
        return false;
    }
    return true;
}
function sendFiles(files) {
    for (const f of Array.from(files))
        void sendAttachment(current, f, f.name || "file", f.type);
}
async function sendAttachment(c, file, name, mediaType, durationMs) {
    if (!canAttach(c, file.size))
        return;
    const job = {
        id: ++uploadSeq, conv: c.id, file, name, mediaType: mediaType.split(";")[0].trim() || "application/octet-stream",
        durationMs, cmid: crypto.randomUUID(), sent: 0, state: "uploading", ctl: new AbortController(),
    };
    uploads.set(job.id, job);
    await runUpload(job);
}
async function runUpload(job) {
    job.state = "uploading";
    job.error = undefined;
    job.ctl = new AbortController();
    renderUploads();
    const onProgress = (p) => { job.sent = p.sent; renderProgress(job); };
    try {
        const up = job.attachmentId
            ? await client.resume(job.attachmentId, job.file, { onProgress, signal: job.ctl.signal })
            : await client.upload(job.conv, job.file, {
                name: job.name, mediaType: job.mediaType, onProgress, signal: job.ctl.signal,
                onCreate: (u) => { job.attachmentId = u.attachment_id; },
            });
        job.state = "sending";
        renderUploads();
        await client.sendFile(job.conv, up.attachment_id, { durationMs: job.durationMs, clientMsgId: job.cmid });
        uploads.delete(job.id);
    }
    catch (e) {
        if (job.ctl.signal.aborted)
            uploads.delete(job.id);
        else {
            job.state = "failed";
            job.error = e instanceof Error ? e.message : String(e);
        }
    }
    renderUploads();
}
function renderProgress(job) {
    const li = document.querySelector(`#uploads li[data-upload="${job.id}"]`);
    if (!li)
        return;
    const pct = job.file.size ? Math.floor((job.sent / job.file.size) * 100) : 100;
    const bar = li.querySelector("progress");
    bar.value = pct;
    li.querySelector(".pct").textContent = `${pct}%`;
}
function renderUploads() {
    const ul = $("uploads");
    const jobs = [...uploads.values()].filter((j) => j.conv === current?.id);
    ul.replaceChildren(...jobs.map((job) => {
        const li = document.createElement("li");
        li.dataset.upload = String(job.id);
        li.dataset.state = job.state;
        const label = document.createElement("span");
        label.className = "name";
        label.textContent = `${job.durationMs !== undefined ? "Voice note" : job.name} · ${humanSize(job.file.size)}`;
        const bar = document.createElement("progress");
        bar.max = 100;
        bar.setAttribute("aria-label", `Uploading ${job.name}`);
        const pct = document.createElement("span");
        pct.className = "pct";
        li.append(label, bar, pct);
        if (job.state === "failed") {
            const err = document.createElement("span");
            err.className = "error";
            err.textContent = `Failed: ${job.error}`;
            li.append(err, button("Retry", `Retry uploading ${job.name}`, () => void runUpload(job)), button("Dismiss", `Dismiss ${job.name}`, () => { uploads.delete(job.id); renderUploads(); }));
        }
        else if (job.state === "uploading") {
            li.append(button("Cancel", `Cancel uploading ${job.name}`, () => job.ctl.abort("cancelled")));
        }
        else {
            pct.textContent = "sending…";
        }
        return li;
    }));
    for (const job of jobs)
        if (job.state !== "sending")
            renderProgress(job);
}
async function toggleRecording() {
    if (recorder) {
        recorder.rec.stop();
        return;
    }
    const c = current;
    if (!canAttach(c, 0))
        return;
    let stream;
    try {
        stream = await navigator.mediaDevices.getUserMedia({ audio: true });
    }
    catch (e) {
        alertError(`microphone: ${e instanceof Error ? e.message : e}`);
        return;
    }
    const mime = ["audio/webm;codecs=opus", "audio/ogg;codecs=opus", "audio/webm", "audio/mp4"].find((t) => MediaRecorder.isTypeSupported(t));
    const rec = new MediaRecorder(stream, mime ? { mimeType: mime } : undefined);
    const chunks = [];
    rec.addEventListener("dataavailable", (ev) => { if (ev.data.size)
        chunks.push(ev.data); });
    const r = { rec, stream, started: Date.now(), cancelled: false, conv: c, timer: setInterval(() => renderRecording(), 250) };
    recorder = r;
    rec.addEventListener("stop", () => {
        clearInterval(r.timer);
        for (const t of stream.getTracks())
            t.stop();
        recorder = null;
        renderRecording();
        if (r.cancelled || !chunks.length)
            return;
        const type = rec.mimeType || mime || "audio/webm";
        const blob = new Blob(chunks, { type });
        const ext = type.includes("ogg") ? "ogg" : type.includes("mp4") ? "m4a" : "webm";
        const stamp = new Date(r.started).toISOString().slice(0, 19).replace(/[:T]/g, "-");
        void sendAttachment(r.conv, blob, `voice-note-${stamp}.${ext}`, type, Date.now() - r.started);
    });
    rec.start(250);
    renderRecording();
}
function renderRecording() {
    const b = $("record");
    const on = !!recorder;
    b.setAttribute("aria-pressed", String(on));
    b.setAttribute("aria-label", on ? "Stop recording and send the voice note" : "Record a voice note");
    b.textContent = on ? "Stop" : "Record";
    $("recording").hidden = !on;
    if (recorder)
        $("recording-time").textContent = clock(Date.now() - recorder.started);
}
function wireAttachments() {
    const input = $("file");
    $("attach").addEventListener("click", () => input.click());
    input.addEventListener("change", () => {
        sendFiles(input.files ?? []);
        input.value = "";
    });
    $("record").addEventListener("click", () => void toggleRecording());
    $("cancel-recording").addEventListener("click", () => {
        if (!recorder)
            return;
        recorder.cancelled = true;
        recorder.rec.stop();
    });
    // Drag and drop onto the conversation.
    const chat = $("chat");
    let depth = 0;
    const hasFiles = (ev) => !!ev.dataTransfer && [...ev.dataTransfer.types].includes("Files");
    chat.addEventListener("dragenter", (ev) => {
        if (!hasFiles(ev) || !current)
            return;
        ev.preventDefault();
        depth++;
        chat.classList.add("drop");
    });
    chat.addEventListener("dragover", (ev) => {
        if (!hasFiles(ev) || !current)
            return;
        ev.preventDefault();
        ev.dataTransfer.dropEffect = current.e2e ? "none" : "copy";
    });
    chat.addEventListener("dragleave", () => {
        if (--depth <= 0) {
            depth = 0;
            chat.classList.remove("drop");
        }
    });
    chat.addEventListener("drop", (ev) => {
        if (!hasFiles(ev))
            return;
        ev.preventDefault();
        depth = 0;
        chat.classList.remove("drop");
        sendFiles(ev.dataTransfer.files);
    });
    // Pasting an image (a screenshot, a copied picture) into the composer sends it.
    $("text").addEventListener("paste", (ev) => {
        const files = Array.from(ev.clipboardData?.files ?? []);
        if (!files.length)
            return;
        ev.preventDefault();
        sendFiles(files);
    });
    $("viewer-close").addEventListener("click", () => $("viewer").close());
    $("viewer").addEventListener("click", (ev) => { if (ev.target === $("viewer"))
        $("viewer").close(); });
}
// Web Push (docs/push.md, "Web Push on the page"): nothing is asked on
// load; the permission prompt and the subscription come only from a click
// on "Enable notifications".
/** How long pushManager.subscribe may take: a browser whose push service is unreachable never answers. */
const subscribeTimeoutMs = 20_000;
function pushSupported() {
    return "serviceWorker" in navigator && "PushManager" in window && "Notification" in window;
}
function notifyNote(text) {
    $("notify-note").textContent = text;
}
/** This origin's subscription, if the worker is registered and subscribed (never prompts). */
async function currentSubscription() {
    if (!pushSupported())
        return null;
    const reg = await navigator.serviceWorker.getRegistration("/");
    return (await reg?.pushManager.getSubscription()) ?? null;
}
/** Registers sub for this device (push_register): also on each connect, as the subscription or the tab's device may have changed. */
async function registerSubscription(sub) {
    const j = sub.toJSON();
    if (!j.endpoint || !j.keys?.p256dh || !j.keys?.auth)
        throw new Error("the subscription has no endpoint or keys");
    await client.pushRegister({ provider: "webpush", endpoint: j.endpoint, p256dh: j.keys.p256dh, auth: j.keys.auth });
}
/** On connect: shows the control when the server sends Web Push, and refreshes a subscription granted earlier. */
async function refreshPush() {
    const key = client.webPushKey;
    $("notify-panel").hidden = !key;
    if (!key)
        return;
    try {
        const sub = Notification.permission === "granted" ? await currentSubscription() : null;
        if (sub && sameKey(sub, key)) {
            await registerSubscription(sub);
            pushOn(true);
            return;
        }
    }
    catch (e) {
        console.warn("push: refreshing the subscription failed:", e);
    }
    pushOn(false);
}
function pushOn(on) {
    $("notify").textContent = on ? "Turn off notifications" : "Enable notifications";
    $("notify").dataset.on = on ? "1" : "";
    if (on)
        notifyNote("Notifications are on: this browser shows new messages while Parley is closed.");
}
function togglePush() {
    return $("notify").dataset.on ? disablePush() : enablePush();
}
/**
 * enablePush runs on the click: the permission prompt first (while the
 * click's user activation lasts), then the service worker, the
 * subscription with the server's VAPID key and push_register.
 */
async function enablePush() {
    const key = client.webPushKey;
    if (!key)
        return notifyNote("This server sends no push notifications.");
    if (!pushSupported()) {
        return notifyNote("This browser cannot show notifications while Parley is closed: it has no service workers or Push API here (on iOS, add Parley to the home screen first).");
    }
    const perm = await Notification.requestPermission();
    if (perm === "denied")
        return notifyNote("Notifications are blocked for this site. Allow them in the browser's site settings, then click again.");
    if (perm !== "granted")
        return notifyNote("Notifications were not allowed: the question was dismissed. Click again to be asked once more.");
    notifyNote("Subscribing to the browser's push service…");
    $("notify").disabled = true;
    try {
        const reg = await navigator.serviceWorker.register("/sw.js", { scope: "/" });
        await navigator.serviceWorker.ready;
        const old = await reg.pushManager.getSubscription();
        if (old && !sameKey(old, key))
            await old.unsubscribe(); // the server's key changed
        const sub = await within(reg.pushManager.subscribe({ userVisibleOnly: true, applicationServerKey: fromBase64url(key) }), subscribeTimeoutMs, `no answer within ${subscribeTimeoutMs / 1000} s`);
        await registerSubscription(sub);
        pushOn(true);
    }
    catch (e) {
        notifyNote(`The browser's push service is not available (${e instanceof Error ? e.message : e}), so notifications stay off. Try again later, or in a browser window that is not private.`);
    }
    finally {
        $("notify").disabled = false;
    }
}
/** disablePush: push_remove of every registration of this device, then the browser's subscription goes. */
async function disablePush() {
    try {
        await client.pushRemove();
        await (await currentSubscription())?.unsubscribe();
        pushOn(false);
        notifyNote("Notifications are off.");
    }
    catch (e) {
        notifyNote(`Turning notifications off failed: ${e instanceof Error ? e.message : e}`);
    }
}
/**
 * signOut: this device's push registrations are removed (no notifications
 * reach a signed-out browser) and its subscription dropped; then the token
 * is forgotten and the sign-in shows.
 */
async function signOut() {
    $("signout").disabled = true;
    try {
        await within(client.pushRemove(), 5000, "no answer");
    }
    catch (e) {
        // Offline: the dropped subscription's endpoint answers 410, and the server removes it then.
        console.warn("push: removing this device's registrations failed:", e);
    }
    try {
        await (await currentSubscription())?.unsubscribe();
    }
    catch (e) {
        console.warn("push: unsubscribing failed:", e);
    }
    client.close();
    sessionStorage.removeItem("parley.token");
    sessionStorage.removeItem("parley.open");
    location.replace("/");
}
function sameKey(sub, key) {
    const k = sub.options.applicationServerKey;
    return !!k && toBase64url(new Uint8Array(k)) === key;
}
function fromBase64url(s) {
    const bin = atob(s.replace(/-/g, "+").replace(/_/g, "/"));
    return Uint8Array.from(bin, (c) => c.charCodeAt(0));
}
function toBase64url(b) {
    return btoa(String.fromCharCode(...b)).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}
/** within rejects when p has not settled after ms. */
function within(p, ms, what) {
    let timer;
    const late = new Promise((_, reject) => { timer = setTimeout(() => reject(new Error(what)), ms); });
    return Promise.race([p, late]).finally(() => clearTimeout(timer));
}
function split(s) {
    return s.split(/[\s,]+/).map((x) => x.trim()).filter(Boolean);
}
void boot();
