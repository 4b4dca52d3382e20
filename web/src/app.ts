// The web chat page served by `parley serve` at /. It uses the TypeScript
// SDK (sdk/ts) as compiled ES modules; no framework. Tokens: on the
// development key the user picks a name and POST /v1/dev/token mints one;
// otherwise the embedding application passes one as /#token=<JWT>.
import { Client, StoragePositions, type ConvSummary, type Message, type Receipt } from "../../sdk/ts/src/index.js";

const $ = <T extends HTMLElement = HTMLElement>(id: string) => document.getElementById(id) as T;

interface Conv {
  id: string;
  kind: "direct" | "group";
  name: string;
  peer?: string;
  lastSeq: number;
  readSeq: number;
  joinSeq: number;
  mentioned: boolean;
  msgs: Map<number, Message>;
  loaded: boolean; // history loaded at least once
  oldest: number; // lowest seq loaded (0: none)
  hasOlder: boolean;
  peerDelivered: number;
  peerRead: number;
}

interface Outgoing { cmid: string; body: string; state: "sending" | "failed" }

let client: Client;
let me = "";
const convs = new Map<string, Conv>();
const outbox = new Map<string, Map<string, Outgoing>>(); // conv → client_msg_id → pending send
let current: Conv | null = null;
let editing: { conv: string; seq: number } | null = null;
const typingUntil = new Map<string, number>(); // conv/user → until
const presence = new Map<string, { online: boolean; last_seen?: number }>();
let lastTypingSent = 0;

function deviceId(): string {
  let d = sessionStorage.getItem("parley.device");
  if (!d) {
    d = "web-" + Math.random().toString(36).slice(2, 10);
    sessionStorage.setItem("parley.device", d);
  }
  return d;
}

function tokenUser(token: string): string {
  try {
    const p = token.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
    return JSON.parse(atob(p)).sub ?? "";
  } catch {
    return "";
  }
}

async function boot() {
  const frag = new URLSearchParams(location.hash.slice(1));
  let token = frag.get("token") ?? sessionStorage.getItem("parley.token") ?? "";
  if (frag.has("token")) history.replaceState(null, "", location.pathname);
  if (!token) token = await login();
  sessionStorage.setItem("parley.token", token);
  start(token);
}

function login(): Promise<string> {
  $("login").hidden = false;
  $<HTMLInputElement>("login-name").focus();
  return new Promise((resolve) => {
    $("login-form").addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const user = $<HTMLInputElement>("login-name").value.trim();
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

function start(token: string) {
  me = tokenUser(token);
  $("app").hidden = false;
  $("me").textContent = me;
  const device = deviceId();
  client = new Client({
    url: location.origin, token, device,
    positions: new StoragePositions(localStorage, `parley.pos.${me}.${device}`),
  });
  let countdown: ReturnType<typeof setInterval> | null = null;
  const status = (state: string, text: string) => {
    const s = $("status");
    s.dataset.state = state;
    s.textContent = text;
    $("retry").hidden = state !== "reconnecting";
  };
  client.on("connected", ({ transport }) => {
    if (countdown) clearInterval(countdown);
    status("connected", transport === "http" ? "Connected (HTTP fallback)" : "Connected");
    void refreshList();
  });
  client.on("disconnected", () => status("reconnecting", "Disconnected"));
  client.on("reconnecting", ({ at }) => {
    if (countdown) clearInterval(countdown);
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
    if (!c) return;
    c.lastSeq = Math.max(c.lastSeq, snapshot.last_seq);
    c.readSeq = Math.max(c.readSeq, snapshot.read_seq);
    renderList();
  });
  client.on("message", ({ convId, message }) => onMessage(convId, message));
  client.on("receipt", onReceipt);
  client.on("typing", ({ convId, userId }) => {
    typingUntil.set(`${convId}/${userId}`, Date.now() + 3000);
    renderTyping();
    setTimeout(renderTyping, 3100);
  });
  client.on("presence", (states) => {
    for (const s of states) presence.set(s.user_id, s);
    renderPresence();
    renderList();
  });
  wire();
  client.start();
}

function fromSummary(s: ConvSummary): Conv {
  const old = convs.get(s.conv_id);
  const c: Conv = old ?? {
    id: s.conv_id, kind: s.kind, name: "", lastSeq: 0, readSeq: 0, joinSeq: 0, mentioned: false,
    msgs: new Map(), loaded: false, oldest: 0, hasOlder: false, peerDelivered: 0, peerRead: 0,
  };
  c.kind = s.kind;
  c.peer = s.peer;
  c.name = s.kind === "direct" ? (s.peer ?? "?") : (s.name || "group");
  c.lastSeq = Math.max(c.lastSeq, s.leave_seq || s.last_seq);
  c.readSeq = Math.max(c.readSeq, s.read_seq);
  c.joinSeq = s.join_seq;
  c.mentioned = !!s.mentioned && c.readSeq < c.lastSeq;
  convs.set(c.id, c);
  return c;
}

async function refreshList() {
  const list = await client.conversations();
  for (const s of list) fromSummary(s);
  renderList();
  watchPeers();
  if (current) void openConv(current.id, false);
}

/** Watches the presence of every direct peer (the server allows at most 200). */
function watchPeers() {
  const peers = [...convs.values()].filter((c) => c.kind === "direct" && c.peer).map((c) => c.peer!);
  if (!peers.length) return;
  client.watchPresence(peers.slice(0, 200)).then((st) => {
    for (const s of st) presence.set(s.user_id, s);
    renderPresence();
    renderList();
  }, () => {});
}

function unread(c: Conv): number {
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
    b.append(name);
    if (c.mentioned) b.append(badge("@", "badge mention"));
    if (n > 0) b.append(badge(String(n), "badge unread"));
    b.addEventListener("click", () => void openConv(c.id, true));
    li.append(b);
    return li;
  }));
}

function lastTime(c: Conv): number {
  let t = 0;
  for (const m of c.msgs.values()) t = Math.max(t, m.server_time);
  return t || c.lastSeq;
}

function badge(text: string, cls: string) {
  const s = document.createElement("span");
  s.className = cls;
  s.textContent = text;
  s.setAttribute("aria-hidden", "true");
  return s;
}

async function openConv(id: string, focus: boolean) {
  const c = convs.get(id);
  if (!c) return;
  current = c;
  $("app").classList.add("open");
  $("chat").hidden = false;
  $("title").textContent = (c.kind === "group" ? "# " : "") + c.name;
  $("add-members").hidden = c.kind !== "group";
  renderList();
  renderPresence();
  if (!c.loaded) {
    const page = await client.history(id, { limit: 30 });
    for (const m of page.messages) addMessage(c, m);
    c.hasOlder = page.hasMore;
    c.loaded = true;
  }
  renderMessages(true);
  markRead(c);
  if (focus) $("text").focus();
}

async function loadOlder() {
  const c = current;
  if (!c || !c.hasOlder || !c.oldest) return;
  c.hasOlder = false; // one page at a time
  const list = $("messages");
  const before = list.scrollHeight;
  const page = await client.history(c.id, { beforeSeq: c.oldest, limit: 30 });
  for (const m of page.messages) addMessage(c, m);
  c.hasOlder = page.hasMore;
  renderMessages(false);
  list.scrollTop = list.scrollHeight - before;
}

function markRead(c: Conv) {
  if (current !== c || document.hidden || unread(c) === 0) return;
  const seq = c.lastSeq;
  c.readSeq = seq;
  c.mentioned = false;
  renderList();
  client.read(c.id, seq).catch(() => {});
}

/** Records a message (or applies an edit/recall event) in the conversation. */
function addMessage(c: Conv, m: Message) {
  if (c.oldest === 0 || m.seq < c.oldest) c.oldest = m.seq;
  if ((m.kind === "edit" || m.kind === "recall") && m.target_seq) {
    const t = c.msgs.get(m.target_seq);
    if (t) {
      if (m.kind === "edit") { t.body = m.body; t.edited = true; } else { t.body = ""; t.recalled = true; }
    }
    c.msgs.set(m.seq, m);
    return;
  }
  if (m.kind === "state" && m.coalesce_key) {
    for (const o of c.msgs.values()) if (o.kind === "state" && o.coalesce_key === m.coalesce_key && o.seq < m.seq) o.superseded = true;
  }
  c.msgs.set(m.seq, m);
  if (m.client_msg_id) outbox.get(c.id)?.delete(m.client_msg_id);
}

function onMessage(convId: string, m: Message) {
  let c = convs.get(convId);
  if (!c) {
    c = fromSummary({ conv_id: convId, kind: "group", last_seq: 0, read_seq: 0, join_seq: 0, unread: 0 });
    void refreshList();
  }
  c.lastSeq = Math.max(c.lastSeq, m.seq);
  if (m.sender === me) c.readSeq = Math.max(c.readSeq, m.seq);
  else if (m.mention_all || m.mentions?.includes(me)) c.mentioned = true;
  if (c.loaded) addMessage(c, m);
  if (typingUntil.delete(`${convId}/${m.sender}`)) renderTyping();
  if (c === current) {
    renderMessages(nearBottom());
    markRead(c);
  }
  renderList();
}

function onReceipt(r: Receipt) {
  const c = convs.get(r.conv_id);
  if (!c) return;
  if (r.user_id === me) {
    if (r.state === "read" && r.seq > c.readSeq) {
      // Read on another device of mine: clear the badge here too.
      c.readSeq = r.seq;
      if (c.readSeq >= c.lastSeq) c.mentioned = false;
      renderList();
    }
    return;
  }
  if (r.state === "delivered") c.peerDelivered = Math.max(c.peerDelivered, r.seq);
  else c.peerRead = Math.max(c.peerRead, r.seq);
  c.peerDelivered = Math.max(c.peerDelivered, c.peerRead);
  if (c === current) renderMessages(nearBottom());
}

function nearBottom(): boolean {
  const l = $("messages");
  return l.scrollHeight - l.scrollTop - l.clientHeight < 80;
}

function stateOf(c: Conv, m: Message): string {
  if (c.kind !== "direct") return "stored";
  if (c.peerRead >= m.seq) return "read";
  if (c.peerDelivered >= m.seq) return "delivered";
  return "stored";
}

function systemText(m: Message): string {
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
    }
  } catch { /* fall through */ }
  return m.body ?? "";
}

function renderMessages(stick: boolean) {
  const c = current;
  if (!c) return;
  const list = $("messages");
  const items: HTMLElement[] = [];
  const seqs = [...c.msgs.keys()].sort((a, b) => a - b);
  for (const seq of seqs) {
    const m = c.msgs.get(seq)!;
    if (m.kind === "edit" || m.kind === "recall" || m.superseded) continue;
    const li = document.createElement("li");
    li.dataset.seq = String(m.seq);
    if (m.kind === "system") {
      li.className = "system";
      li.textContent = systemText(m);
      items.push(li);
      continue;
    }
    const mine = m.sender === me;
    if (mine) li.classList.add("mine");
    const body = document.createElement("div");
    body.className = "body" + (m.recalled ? " recalled" : "");
    body.textContent = m.recalled ? "message recalled" : (m.kind === "state" ? `[${m.coalesce_key}] ` : "") + (m.body ?? "");
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
      if (m.kind === "text" && !m.recalled) {
        meta.append(button("Edit", `Edit message ${m.seq}`, () => startEdit(c, m)));
        meta.append(button("Recall", `Recall message ${m.seq}`, () => void client.recall(c.id, m.seq).catch(alertError)));
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
    li.querySelector(".body")!.textContent = o.body;
    li.querySelector(".state")!.textContent = o.state;
    items.push(li);
  }
  list.replaceChildren(...items);
  if (stick) list.scrollTop = list.scrollHeight;
}

function button(text: string, label: string, fn: () => void) {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = text;
  b.setAttribute("aria-label", label);
  b.addEventListener("click", fn);
  return b;
}

function startEdit(c: Conv, m: Message) {
  editing = { conv: c.id, seq: m.seq };
  $("editing").hidden = false;
  const t = $<HTMLTextAreaElement>("text");
  t.value = m.body ?? "";
  t.focus();
}

function stopEdit() {
  editing = null;
  $("editing").hidden = true;
}

function alertError(e: unknown) {
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
  const t = $<HTMLTextAreaElement>("text");
  const body = t.value.trim();
  if (!c || !body) return;
  t.value = "";
  if (editing && editing.conv === c.id) {
    const seq = editing.seq;
    stopEdit();
    await client.edit(c.id, seq, body).catch(alertError);
    return;
  }
  const mentions = [...body.matchAll(/@([A-Za-z0-9._@-]+)/g)].map((x) => x[1]).filter((u) => u !== "everyone" && u !== me);
  const cmid = crypto.randomUUID();
  let box = outbox.get(c.id);
  if (!box) outbox.set(c.id, (box = new Map()));
  box.set(cmid, { cmid, body, state: "sending" });
  renderMessages(true);
  try {
    const ack = await client.send(c.id, body, {
      clientMsgId: cmid,
      mentions: c.kind === "group" ? mentions : undefined,
      mentionAll: c.kind === "group" && /@everyone\b/.test(body),
    });
    box.delete(cmid);
    c.lastSeq = Math.max(c.lastSeq, ack.seq);
    if (c.loaded && !c.msgs.has(ack.seq)) {
      addMessage(c, { conv_id: c.id, seq: ack.seq, msg_id: ack.msg_id, sender: me, kind: "text", body, client_msg_id: cmid, server_time: ack.server_time });
    }
  } catch (e) {
    const o = box.get(cmid);
    if (o) o.state = "failed";
    alertError(e);
  }
  if (current === c) renderMessages(true);
}

function wire() {
  $("new-direct").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const peer = $<HTMLInputElement>("peer");
    try {
      const info = await client.openDirect(peer.value.trim());
      fromSummary({ conv_id: info.conv_id, kind: "direct", peer: peer.value.trim(), last_seq: info.last_seq, read_seq: 0, join_seq: info.join_seq, unread: 0 });
      peer.value = "";
      watchPeers();
      await openConv(info.conv_id, true);
    } catch (e) { alertError(e); }
  });
  $("new-group").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const name = $<HTMLInputElement>("group-name"), members = $<HTMLInputElement>("group-members");
    try {
      const info = await client.createGroup(name.value.trim(), split(members.value));
      fromSummary({ conv_id: info.conv_id, kind: "group", name: info.name, last_seq: info.last_seq, read_seq: info.last_seq, join_seq: info.join_seq, unread: 0 });
      name.value = members.value = "";
      await openConv(info.conv_id, true);
    } catch (e) { alertError(e); }
  });
  $("add-members").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const input = $<HTMLInputElement>("add-input");
    if (!current) return;
    try {
      await client.addMembers(current.id, split(input.value));
      input.value = "";
    } catch (e) { alertError(e); }
  });
  $("composer").addEventListener("submit", (ev) => { ev.preventDefault(); void submit(); });
  const text = $<HTMLTextAreaElement>("text");
  text.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); void submit(); }
    if (ev.key === "Escape" && editing) { stopEdit(); text.value = ""; }
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
    renderList();
    $("peer").focus();
  });
  $("retry").addEventListener("click", () => client.reconnectNow());
  $("messages").addEventListener("scroll", () => { if ($("messages").scrollTop < 40) void loadOlder(); });
  document.addEventListener("visibilitychange", () => { if (current) markRead(current); });
}

function split(s: string): string[] {
  return s.split(/[\s,]+/).map((x) => x.trim()).filter(Boolean);
}

void boot();
