import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import WebSocket from "ws";
import { Server, seqs } from "./server.mjs";

// Groups of 3–4 members are medium, larger ones large; unacknowledged
// pushes are re-sent after 300 ms, so a re-send would show.
let srv;
before(async () => { srv = await Server.start(["--chat.small-below", "3", "--chat.large-above", "4", "--gateway.retransmit-after", "300ms"]); });
after(async () => { await srv?.close(); });

/** A ws WebSocket that records what it sends and receives and drops the pushes drop() picks. */
function tappedWS(tap) {
  return class extends WebSocket {
    constructor(url, protocols) {
      super(url, protocols);
      let inner = null;
      Object.defineProperty(this, "onmessage", {
        get: () => inner,
        set: (fn) => {
          inner = fn;
          super.onmessage = (ev) => {
            const f = JSON.parse(String(ev.data));
            tap.got.push(f);
            if (!tap.drop(f)) fn({ data: String(ev.data) });
          };
        },
      });
    }
    send(data) {
      tap.sent.push(JSON.parse(String(data)));
      super.send(data);
    }
  };
}

const names = (f, conv) => f.type === "delivered" && (f.conv_id === conv || (f.positions ?? []).some((p) => p.conv_id === conv));
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

test("a large group's pushes are untracked: dropped ones are filled by seq from history, none acknowledged, none re-sent", async () => {
  const tap = { got: [], sent: [], drop: () => false };
  const a = await srv.client("big-a");
  const b = await srv.client("big-b", "d1", { WebSocket: tappedWS(tap) });
  await Promise.all([a.log.waitConnected(), b.log.waitConnected()]);
  const g = await a.createGroup("big", ["big-b", "big-u1", "big-u2", "big-u3", "big-u4"]);
  const first = g.last_seq + 1;
  const lost = new Set([first + 1, first + 2, first + 6, first + 9]);
  tap.drop = (f) => f.type === "msg" && f.message.conv_id === g.conv_id && lost.has(f.message.seq);
  let last = 0;
  for (let i = 0; i < 12; i++) last = (await a.send(g.conv_id, `m${i}`)).seq;
  await b.log.waitFor((ev) => ev.some((e) => e.kind === "message" && e.convId === g.conv_id && e.message.seq === last), "the last message");
  await sleep(1500); // several re-send periods, and the client's slow timer
  const got = seqs(b.log.messages(g.conv_id)).filter((s) => s >= first);
  assert.deepEqual(got, Array.from({ length: last - first + 1 }, (_, i) => first + i));
  assert.ok(tap.sent.some((f) => f.type === "history" && f.conv_id === g.conv_id), "holes filled without a history request");
  const pushes = tap.got.filter((f) => f.type === "msg" && f.message.conv_id === g.conv_id && f.message.seq >= first);
  assert.ok(pushes.every((f) => f.ack === "none"), "a large group's push without ack none");
  assert.equal(pushes.length, last - first + 1, "a push was re-sent");
  assert.ok(!tap.sent.some((f) => names(f, g.conv_id)), "the client acknowledged a large group's push");
  a.close(); b.close();
});

test("medium groups' acknowledgements are batched into one delivered frame with positions; direct receipts still come", async () => {
  const tap = { got: [], sent: [], drop: () => false };
  const a = await srv.client("mid-a");
  const b = await srv.client("mid-b", "d1", { WebSocket: tappedWS(tap) });
  await Promise.all([a.log.waitConnected(), b.log.waitConnected()]);
  const g1 = await a.createGroup("g1", ["mid-b", "mid-c"]);
  const g2 = await a.createGroup("g2", ["mid-b", "mid-c"]);
  const { conv_id: direct } = await a.openDirect("mid-b");
  const last = {};
  for (let i = 0; i < 5; i++) {
    for (const g of [g1, g2]) last[g.conv_id] = (await a.send(g.conv_id, `m${i}`)).seq;
  }
  const d = await a.send(direct, "hi");
  await a.log.waitFor((ev) => ev.some((e) => e.kind === "receipt" && e.conv_id === direct && e.state === "delivered" && e.seq >= d.seq), "the direct delivered receipt");
  const covered = (conv) => tap.sent.some((f) => f.type === "delivered" &&
    ((f.conv_id === conv && f.seq >= last[conv]) || (f.positions ?? []).some((p) => p.conv_id === conv && p.seq >= last[conv])));
  for (let i = 0; i < 100 && !(covered(g1.conv_id) && covered(g2.conv_id)); i++) await sleep(50);
  assert.ok(covered(g1.conv_id) && covered(g2.conv_id), "the groups were not acknowledged to their last seq: " + JSON.stringify(tap.sent.filter((f) => f.type === "delivered")));
  assert.ok(tap.sent.some((f) => (f.positions ?? []).some((p) => p.conv_id === g1.conv_id) && f.positions.some((p) => p.conv_id === g2.conv_id)),
    "no delivered frame acknowledged both groups");
  const pushes = tap.got.filter((f) => f.type === "msg" && (f.message.conv_id === g1.conv_id || f.message.conv_id === g2.conv_id));
  assert.ok(pushes.length > 0 && pushes.every((f) => f.ack === "batch"), "a medium group's push without ack batch");
  a.close(); b.close();
});
