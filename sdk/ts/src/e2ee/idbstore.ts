// IDBStore keeps a device's state in the browser's IndexedDB, one
// database per device. Each batch is one readwrite transaction, which
// IndexedDB commits whole or not at all (durability "strict" where the
// browser supports it): a tab closed or crashed mid-operation leaves the
// ratchet where it was before that operation. Values are sealed at rest
// with AES-256-GCM under a WebCrypto key made non-extractable (kept in the
// same database as a CryptoKey object, which no script can export), the
// value's key name as additional data, so a value copied under another
// name does not open. The protocol's own keys stay byte strings: the
// primitives WebCrypto lacks (X25519 in every browser, XEdDSA, ML-KEM) run
// in @noble code that needs the raw bytes.

import type { Store, StoreOp } from "./store.js";
import { utf8 } from "./bytes.js";

const VALUES = "values";
const META = "meta";

const buf = (b: Uint8Array) => b as Uint8Array<ArrayBuffer>;

function req<T>(r: IDBRequest<T>): Promise<T> {
  return new Promise((resolve, reject) => {
    r.onsuccess = () => resolve(r.result);
    r.onerror = () => reject(r.error);
  });
}

function done(tx: IDBTransaction): Promise<void> {
  return new Promise((resolve, reject) => {
    tx.oncomplete = () => resolve();
    tx.onabort = () => reject(tx.error ?? new Error("IDBStore: transaction aborted"));
    tx.onerror = () => reject(tx.error);
  });
}

export class IDBStore implements Store {
  private constructor(
    private readonly db: IDBDatabase,
    private readonly key: CryptoKey,
  ) {}

  // open opens (creating it if needed) the database name and its sealing key.
  static async open(name: string): Promise<IDBStore> {
    const open = indexedDB.open(name, 1);
    open.onupgradeneeded = () => {
      open.result.createObjectStore(VALUES);
      open.result.createObjectStore(META);
    };
    const db = await req(open);
    let key = (await req(db.transaction(META).objectStore(META).get("seal"))) as CryptoKey | undefined;
    if (!key) {
      const fresh = await crypto.subtle.generateKey({ name: "AES-GCM", length: 256 }, false, ["encrypt", "decrypt"]);
      const tx = db.transaction(META, "readwrite");
      const meta = tx.objectStore(META);
      // Another tab may have made one meanwhile: the first one stays.
      const cur = (await req(meta.get("seal"))) as CryptoKey | undefined;
      if (cur) key = cur;
      else {
        meta.put(fresh, "seal");
        key = fresh;
      }
      await done(tx);
    }
    return new IDBStore(db, key);
  }

  private async seal(name: string, v: Uint8Array): Promise<Uint8Array> {
    const iv = crypto.getRandomValues(new Uint8Array(12));
    const ct = new Uint8Array(await crypto.subtle.encrypt({ name: "AES-GCM", iv, additionalData: buf(utf8(name)) }, this.key, buf(v)));
    const out = new Uint8Array(12 + ct.length);
    out.set(iv);
    out.set(ct, 12);
    return out;
  }

  async load(key: string): Promise<Uint8Array | null> {
    const v = (await req(this.db.transaction(VALUES).objectStore(VALUES).get(key))) as Uint8Array | undefined;
    if (!v) return null;
    const pt = await crypto.subtle.decrypt({ name: "AES-GCM", iv: buf(v.subarray(0, 12)), additionalData: buf(utf8(key)) }, this.key, buf(v.subarray(12)));
    return new Uint8Array(pt);
  }

  async list(prefix: string): Promise<string[]> {
    const range = prefix ? IDBKeyRange.bound(prefix, prefix + "\uffff") : undefined;
    const keys = (await req(this.db.transaction(VALUES).objectStore(VALUES).getAllKeys(range))) as string[];
    return keys.filter((k) => k.startsWith(prefix)).sort();
  }

  async batch(ops: StoreOp[]): Promise<void> {
    // Sealing is asynchronous and an IndexedDB transaction commits once
    // it has no request pending: seal everything first, then write in
    // one transaction.
    const sealed = await Promise.all(ops.map(async (op) => (op.value === null ? null : this.seal(op.key, op.value))));
    const tx = this.db.transaction(VALUES, "readwrite", { durability: "strict" });
    const st = tx.objectStore(VALUES);
    ops.forEach((op, i) => {
      const v = sealed[i];
      if (v === null) st.delete(op.key);
      else st.put(v, op.key);
    });
    await done(tx);
  }

  async close(): Promise<void> {
    this.db.close();
  }

  // destroy deletes the database name (a device given up).
  static async destroy(name: string): Promise<void> {
    await req(indexedDB.deleteDatabase(name));
  }
}
