// Test helpers: build the real `parley` binary once, start `parley serve`
// on a free loopback port with its own data directory (development key),
// mint tokens through POST /v1/dev/token.
import { execFileSync, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtempSync, existsSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import WebSocket from "ws";
import { Client } from "../dist/index.js";

const repo = resolve(dirname(fileURLToPath(import.meta.url)), "../../..");
let bin = process.env.PARLEY_BIN;

export function buildParley() {
  if (bin && existsSync(bin)) return bin;
  bin = join(mkdtempSync(join(tmpdir(), "parley-ts-bin-")), "parley");
  execFileSync("go", ["build", "-o", bin, "./cmd/parley"], { cwd: repo, stdio: "inherit" });
  process.env.PARLEY_BIN = bin;
  return bin;
}

export function freePort() {
  return new Promise((res, rej) => {
    const s = createServer();
    s.on("error", rej);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => res(port));
    });
  });
}

/** A running `parley serve`. restart() stops it and starts it again on the same port and data. */
export class Server {
  constructor(port, dataDir, extra) {
    this.port = port;
    this.dataDir = dataDir;
    this.extra = extra;
    this.url = `http://127.0.0.1:${port}`;
  }

  /** A server with its admin API on (admin() calls it). */
  static async startWithAdmin() {
    const port = await freePort();
    const key = randomBytes(32).toString("hex");
    const s = await Server.start(["--admin.listen", `127.0.0.1:${port}`, "--admin.key", key]);
    s.adminURL = `http://127.0.0.1:${port}`;
    s.adminKey = key;
    return s;
  }

  /** Calls the server API; fails unless it answers 200. */
  async admin(method, path, body) {
    const r = await fetch(this.adminURL + path, {
      method, headers: { Authorization: `Bearer ${this.adminKey}` }, body: body === undefined ? undefined : JSON.stringify(body),
    });
    if (!r.ok) throw new Error(`admin ${method} ${path}: ${r.status} ${await r.text()}`);
    return r.json();
  }

  static async start(extra = []) {
    const s = new Server(await freePort(), mkdtempSync(join(tmpdir(), "parley-ts-data-")), extra);
    await s.launch();
    return s;
  }

  launch() {
    const args = ["serve", "--listen", `127.0.0.1:${this.port}`, "--data-dir", this.dataDir, "--node-id", "ts1",
      "--gateway.drain-timeout", "2s", "--log.level", "warn", ...this.extra];
    this.proc = spawn(buildParley(), args, { stdio: ["ignore", "ignore", "pipe"] });
    this.log = "";
    return new Promise((res, rej) => {
      const timer = setTimeout(() => rej(new Error("parley serve did not start:\n" + this.log)), 30000);
      this.proc.stderr.on("data", (d) => {
        this.log += d;
        if (this.log.includes("serving on")) { clearTimeout(timer); res(); }
      });
      this.proc.on("exit", (code) => { clearTimeout(timer); rej(new Error(`parley serve exited ${code}:\n${this.log}`)); });
    });
  }

  /** SIGTERM (drain: goaway, then close) and wait for the exit. */
  stop() {
    if (!this.proc || this.proc.exitCode !== null) return Promise.resolve();
    return new Promise((res) => {
      this.proc.removeAllListeners("exit");
      this.proc.on("exit", () => res());
      this.proc.kill("SIGTERM");
    });
  }

  async restart() {
    await this.stop();
    await this.launch();
  }

  async close() {
    for (const c of this.clients ?? []) c.close(); // no timers left behind, even after a failed test
    await this.stop();
    rmSync(this.dataDir, { recursive: true, force: true });
  }

  async token(user) {
    const r = await fetch(`${this.url}/v1/dev/token`, { method: "POST", body: JSON.stringify({ user }) });
    if (!r.ok) throw new Error(`dev token: ${r.status} ${await r.text()}`);
    return (await r.json()).token;
  }

  /** A started Client for user on device (Node 20: the ws package's WebSocket). */
  async client(user, device = "d1", opts = {}) {
    const token = await this.token(user);
    const c = new Client({ url: this.url, token, device, WebSocket, minBackoffMs: 50, maxBackoffMs: 1000, ...opts });
    c.log = new Recorder(c);
    (this.clients ??= []).push(c);
    c.start();
    return c;
  }
}

/** Records a client's events; waits for conditions on them. */
export class Recorder {
  constructor(c) {
    this.events = [];
    this.waiters = [];
    for (const k of ["message", "snapshot", "receipt", "typing", "presence", "connected", "disconnected", "reconnecting", "stopped"]) {
      c.on(k, (p) => {
        // structuredClone keeps an Error's message only: keep its code too.
        const e = { kind: k, ...structuredClone(p) };
        if (p?.error?.code) e.errorCode = p.error.code;
        this.events.push(e);
        this.check();
      });
    }
  }
  check() {
    for (const w of [...this.waiters]) {
      if (w.pred(this.events)) { this.waiters.splice(this.waiters.indexOf(w), 1); w.res(); }
    }
  }
  of(kind) { return this.events.filter((e) => e.kind === kind); }
  messages(convId) { return this.of("message").filter((e) => e.convId === convId).map((e) => e.message); }
  waitFor(pred, what = "condition", ms = 15000) {
    if (pred(this.events)) return Promise.resolve();
    return new Promise((res, rej) => {
      const w = { pred, res };
      this.waiters.push(w);
      setTimeout(() => {
        const i = this.waiters.indexOf(w);
        if (i >= 0) { this.waiters.splice(i, 1); rej(new Error(`timed out waiting for ${what}; events: ${JSON.stringify(this.events.slice(-10))}`)); }
      }, ms);
    });
  }
  waitMessages(convId, n, ms) {
    return this.waitFor((ev) => ev.filter((e) => e.kind === "message" && e.convId === convId).length >= n, `${n} messages in ${convId}`, ms);
  }
  waitConnected(n = 1) {
    return this.waitFor((ev) => ev.filter((e) => e.kind === "connected").length >= n, `connected #${n}`);
  }
}

export function seqs(msgs) { return msgs.map((m) => m.seq); }
export function increasing(msgs) { return msgs.every((m, i) => i === 0 || m.seq === msgs[i - 1].seq + 1); }
