// One tab owns a device's state: withDeviceLock runs f while holding the
// Web Lock named after the device (navigator.locks), so a second tab of
// the same profile waits, or with ifAvailable gets null (with signal:
// gives up when it aborts, rejecting with its reason) and follows the
// owner instead of writing its own ratchet steps. Where Web Locks are
// missing (Node, where FileStore locks the directory) f runs as is.

export async function withDeviceLock<T>(
  device: string,
  f: () => Promise<T>,
  opts: { ifAvailable?: boolean; signal?: AbortSignal } = {},
): Promise<T | null> {
  const locks = (globalThis as { navigator?: { locks?: LockManager } }).navigator?.locks;
  if (!locks) return f();
  const o: LockOptions = { mode: "exclusive" };
  if (opts.ifAvailable) o.ifAvailable = true;
  else if (opts.signal) o.signal = opts.signal;
  return locks.request("parley-e2ee:" + device, o, async (lock) => (lock ? f() : null));
}
