package web_test

import (
	"testing"

	"github.com/chromedp/chromedp"
)

// BenchmarkWebE2EE: the cases of sdk/ts/scripts/e2ee-bench.mjs (and of
// client/e2ee's bench_test.go) in the real Chromium, on the page's bundle:
// session setup (a new device, a bundle without one-time keys, the first
// PreKey message opened), encrypt and decrypt of a 100-byte message
// through Device (state in a MemoryStore, as in Node; and in an IDBStore,
// the page's), group encrypt and decrypt. Reported as metrics per case:
//
//	go test -run XXX -bench WebE2EE -benchtime 1x ./web
func BenchmarkWebE2EE(b *testing.B) {
	n := startNode(b)
	br := newBrowser(b)
	tb := br.user("bench")
	tb.run(chromedp.Navigate(n.url()), chromedp.WaitVisible(chromedp.ID("login-name")))
	for i := 0; i < b.N; i++ {
		var r map[string]float64
		tb.evalAsyncLong(`(async () => {
			const e = await `+e2eeModule+`;
			const N = 2000, S = 100, msg = new Uint8Array(100);
			const time = async (n, f) => { const t0 = performance.now(); for (let i = 0; i < n; i++) await f(i); return (performance.now() - t0) / n * 1000; };
			const bob = await e.Device.open(new e.MemoryStore(), { user: "bob", device: "b" });
			const up = await bob.generateKeys(1);
			const reusable = { user: "bob", device: "b", registrationId: up.registrationId, identityKey: up.identityKey, signedPreKey: up.signedPreKey, kemPreKey: up.lastResortKEM };
			const setup = await time(S, async (i) => {
				const a = await e.Device.open(new e.MemoryStore(), { user: "alice", device: "a" + i });
				await a.processBundle(reusable);
				const c = await a.encrypt({ user: "bob", device: "b" }, e.utf8("hello"));
				await bob.decrypt({ user: "alice", device: "a" + i }, c.type, c.body);
			});
			const B = { user: "bob", device: "b" };
			const pair = async (st, A) => {
				const alice = await e.Device.open(st, A);
				await alice.processBundle(reusable);
				let c = await alice.encrypt(B, msg);
				await bob.decrypt(A, c.type, c.body);
				c = await bob.encrypt(A, msg);
				await alice.decrypt(B, c.type, c.body);
				const cts = [];
				const enc = await time(N, async () => cts.push(await alice.encrypt(B, msg)));
				const dec = await time(N, (i) => bob.decrypt(A, cts[i].type, cts[i].body));
				return { alice, enc, dec };
			};
			const A = { user: "alice", device: "pair" };
			const mem = await pair(new e.MemoryStore(), A);
			const idb = await pair(await e.IDBStore.open("bench-" + Date.now()), { user: "alice", device: "idb" });
			await bob.processGroupDistribution("g", A, await mem.alice.groupDistribution("g"));
			const gcts = [];
			const genc = await time(N / 4, async () => gcts.push(await mem.alice.groupEncrypt("g", msg)));
			const gdec = await time(N / 4, (i) => bob.groupDecrypt("g", A, gcts[i]));
			return { setup_ms: setup / 1000, enc_us: mem.enc, dec_us: mem.dec, idb_enc_us: idb.enc, group_enc_us: genc, group_dec_us: gdec };
		})()`, &r)
		for k, v := range r {
			b.ReportMetric(v, k)
		}
	}
}
