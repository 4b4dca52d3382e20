// Store keeps a device's secret state — identity, prekeys, sessions,
// sender keys — as opaque values under keys like "session/bob/phone"
// (the key names of client/e2ee). A Device reads what it needs, works on
// copies and hands each operation's writes to batch() at the end, which
// must apply them all or none: a crash (a closed tab, a killed process)
// never leaves a ratchet half advanced or a prekey consumed without the
// session it made.

export type StoreOp = { key: string; value: Uint8Array } | { key: string; value: null };

export interface Store {
  // load returns the value of key, or null if there is none.
  load(key: string): Promise<Uint8Array | null>;
  // list returns the keys starting with prefix, sorted.
  list(prefix: string): Promise<string[]>;
  // batch applies the writes (value null: delete) atomically and durably.
  batch(ops: StoreOp[]): Promise<void>;
  close?(): Promise<void>;
}

// MemoryStore keeps state in memory (tests, throwaway devices).
export class MemoryStore implements Store {
  private m = new Map<string, Uint8Array>();
  async load(key: string): Promise<Uint8Array | null> {
    const v = this.m.get(key);
    return v ? v.slice() : null;
  }
  async list(prefix: string): Promise<string[]> {
    return [...this.m.keys()].filter((k) => k.startsWith(prefix)).sort();
  }
  async batch(ops: StoreOp[]): Promise<void> {
    for (const op of ops) {
      if (op.value === null) this.m.delete(op.key);
      else this.m.set(op.key, op.value.slice());
    }
  }
}

// Tx collects one operation's writes over a store: reads see the writes
// made so far, commit hands them to Store.batch in order.
export class Tx {
  private pending = new Map<string, Uint8Array | null>();
  private order: string[] = [];
  constructor(readonly st: Store) {}
  async load(key: string): Promise<Uint8Array | null> {
    if (this.pending.has(key)) return this.pending.get(key) ?? null;
    return this.st.load(key);
  }
  async list(prefix: string): Promise<string[]> {
    const ks = new Set(await this.st.list(prefix));
    for (const [k, v] of this.pending) {
      if (!k.startsWith(prefix)) continue;
      if (v === null) ks.delete(k);
      else ks.add(k);
    }
    return [...ks].sort();
  }
  put(key: string, value: Uint8Array): void {
    this.set(key, value);
  }
  del(key: string): void {
    this.set(key, null);
  }
  private set(key: string, v: Uint8Array | null) {
    if (!this.pending.has(key)) this.order.push(key);
    this.pending.set(key, v);
  }
  async commit(): Promise<void> {
    if (this.order.length === 0) return;
    const ops = this.order.map((key) => ({ key, value: this.pending.get(key) ?? null }) as StoreOp);
    this.pending.clear();
    this.order = [];
    await this.st.batch(ops);
  }
}
