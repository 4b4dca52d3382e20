import { test } from "node:test";
import assert from "node:assert/strict";
import { Server, seqs } from "./server.mjs";

test("server restart mid-conversation: goaway honoured, reconnect, catch-up with no loss or duplicate", async () => {
  const srv = await Server.start();
  try {
    const a = await srv.client("rs-a"), b = await srv.client("rs-b");
    await Promise.all([a.log.waitConnected(), b.log.waitConnected()]);
    const { conv_id } = await a.openDirect("rs-b");
    for (let i = 1; i <= 3; i++) await a.send(conv_id, `before ${i}`);
    await b.log.waitMessages(conv_id, 3);
    const stopped = srv.stop();
    // Sends made while the node is down resolve once it is back.
    const during = [a.send(conv_id, "during 1"), a.send(conv_id, "during 2")];
    await stopped;
    await srv.launch();
    const acks = await Promise.all(during);
    for (let i = 1; i <= 2; i++) await b.send(conv_id, `after ${i}`);
    await a.log.waitMessages(conv_id, 7, 30000);
    await b.log.waitMessages(conv_id, 7, 30000);
    await new Promise((r) => setTimeout(r, 500));
    for (const c of [a, b]) assert.deepEqual(seqs(c.log.messages(conv_id)), [1, 2, 3, 4, 5, 6, 7]);
    assert.deepEqual(acks.map((x) => x.seq).sort(), [4, 5]);
    for (const c of [a, b]) {
      assert.ok(c.log.of("reconnecting").length >= 1, "a visible reconnecting state");
      assert.ok(c.log.of("connected").length >= 2, "reconnected");
    }
    a.close(); b.close();
  } finally {
    await srv.close();
  }
});

test("handshake refused with 503 overloaded: the client waits at least Retry-After", async () => {
  const srv = await Server.start(["--gateway.handshake-rate", "0.2", "--gateway.handshake-burst", "1"]);
  try {
    const a = await srv.client("ov-a", "d1", { transport: "http" });
    await a.log.waitConnected();
    const b = await srv.client("ov-b", "d1", { transport: "http" });
    await b.log.waitFor((ev) => ev.some((e) => e.kind === "reconnecting"), "reconnecting after 503");
    const r = b.log.of("reconnecting")[0];
    // The bucket refills one token in 5 s: the server asks for ~5 s (jittered).
    assert.ok(r.delayMs >= 1000, `reconnect delay ${r.delayMs} ms honours retry_after_ms`);
    a.close(); b.close();
  } finally {
    await srv.close();
  }
});
