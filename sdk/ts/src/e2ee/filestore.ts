// FileStore is the Node store: one file per key in a directory (mode 0600,
// the directory 0700). A batch is first written whole to a journal file
// (temporary file, fsync, rename, fsync of the directory), then applied
// key by key the same way, then the journal is removed; opening the store
// replays a journal a crash left behind, so a batch is applied entirely or
// not at all. The directory is locked while the store is open (a .lock
// file holding the owner's pid, taken over only when that process is
// gone): two users of one device's keys would encrypt with the same
// message keys and overwrite each other's ratchets.

/// <reference types="node" />
import { promises as fs, constants } from "node:fs";
import * as path from "node:path";
import { decodeJSON, encodeJSON } from "./bytes.js";
import { fail } from "./errors.js";
import type { Store, StoreOp } from "./store.js";

const LOCK = ".lock";
const JOURNAL = ".journal";

// A key's file name: the key with "/" as "~" and every byte outside
// [A-Za-z0-9._@-] percent-encoded, so no file starts with "." unless it
// is the store's own.
function fileName(key: string): string {
  let s = "";
  for (const b of new TextEncoder().encode(key)) {
    const c = String.fromCharCode(b);
    if (c === "/") s += "~";
    else if (/[A-Za-z0-9_@-]/.test(c) || (c === "." && s !== "")) s += c;
    else s += "%" + b.toString(16).padStart(2, "0");
  }
  return s;
}

function keyName(file: string): string {
  const bytes: number[] = [];
  for (let i = 0; i < file.length; i++) {
    const c = file[i];
    if (c === "~") bytes.push(0x2f);
    else if (c === "%") {
      bytes.push(parseInt(file.slice(i + 1, i + 3), 16));
      i += 2;
    } else bytes.push(c.charCodeAt(0));
  }
  return new TextDecoder().decode(Uint8Array.from(bytes));
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === "EPERM";
  }
}

export class FileStore implements Store {
  private closed = false;
  private queue: Promise<unknown> = Promise.resolve();
  private constructor(readonly dir: string) {}

  // open creates (or opens) the store in dir and locks it; a directory
  // another live process (or another open FileStore) holds is refused
  // with code "locked".
  static async open(dir: string): Promise<FileStore> {
    await fs.mkdir(dir, { recursive: true, mode: 0o700 });
    await fs.chmod(dir, 0o700);
    const lock = path.join(dir, LOCK);
    for (let attempt = 0; ; attempt++) {
      try {
        const h = await fs.open(lock, constants.O_CREAT | constants.O_EXCL | constants.O_WRONLY, 0o600);
        await h.writeFile(String(process.pid));
        await h.sync();
        await h.close();
        break;
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code !== "EEXIST" || attempt > 0) {
          if ((e as NodeJS.ErrnoException).code === "EEXIST") throw fail("locked", "key directory in use by another process: " + dir);
          throw e;
        }
        const pid = parseInt(await fs.readFile(lock, "utf8").catch(() => ""), 10);
        if (pid > 0 && alive(pid)) throw fail("locked", "key directory in use by another process: " + dir);
        await fs.rm(lock, { force: true }); // its owner is gone
      }
    }
    const st = new FileStore(dir);
    for (const f of await fs.readdir(dir)) {
      if (f.startsWith(".tmp-")) await fs.rm(path.join(dir, f), { force: true });
    }
    const j = await fs.readFile(path.join(dir, JOURNAL)).catch(() => null);
    if (j) {
      let ops: StoreOp[] | null = null;
      try {
        ops = decodeJSON<StoreOp[]>(new Uint8Array(j));
      } catch {
        ops = null; // a journal is renamed into place whole; unreadable means foreign
      }
      if (ops) await st.apply(ops);
      await fs.rm(path.join(dir, JOURNAL), { force: true });
      await st.syncDir();
    }
    return st;
  }

  private check() {
    if (this.closed) throw new Error("e2ee: file store closed");
  }

  async load(key: string): Promise<Uint8Array | null> {
    this.check();
    try {
      return new Uint8Array(await fs.readFile(path.join(this.dir, fileName(key))));
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === "ENOENT") return null;
      throw e;
    }
  }

  async list(prefix: string): Promise<string[]> {
    this.check();
    const out: string[] = [];
    for (const f of await fs.readdir(this.dir)) {
      if (f.startsWith(".")) continue;
      const k = keyName(f);
      if (k.startsWith(prefix)) out.push(k);
    }
    return out.sort();
  }

  batch(ops: StoreOp[]): Promise<void> {
    const run = this.queue.then(() => this.write(ops));
    this.queue = run.catch(() => undefined);
    return run;
  }

  private async write(ops: StoreOp[]): Promise<void> {
    this.check();
    if (ops.length === 0) return;
    if (ops.length === 1) {
      await this.apply(ops);
      return;
    }
    await this.atomicWrite(JOURNAL, encodeJSON(ops));
    await this.apply(ops);
    await fs.rm(path.join(this.dir, JOURNAL), { force: true });
    await this.syncDir();
  }

  private async apply(ops: StoreOp[]): Promise<void> {
    for (const op of ops) {
      if (op.value === null) await fs.rm(path.join(this.dir, fileName(op.key)), { force: true });
      else await this.atomicWrite(fileName(op.key), op.value, false);
    }
    await this.syncDir();
  }

  private async atomicWrite(name: string, value: Uint8Array, syncDir = true): Promise<void> {
    const tmp = path.join(this.dir, ".tmp-" + name.replace(/^\./, "") + "-" + process.pid + "-" + Math.random().toString(36).slice(2));
    const h = await fs.open(tmp, "w", 0o600);
    try {
      await h.writeFile(value);
      await h.sync();
    } finally {
      await h.close();
    }
    await fs.rename(tmp, path.join(this.dir, name));
    if (syncDir) await this.syncDir();
  }

  private async syncDir(): Promise<void> {
    const d = await fs.open(this.dir, "r");
    try {
      await d.sync();
    } finally {
      await d.close();
    }
  }

  async close(): Promise<void> {
    if (this.closed) return;
    await this.queue;
    this.closed = true;
    await fs.rm(path.join(this.dir, LOCK), { force: true });
  }
}
