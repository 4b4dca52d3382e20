// A device killed (SIGKILL) while it encrypts: reopened from its
// FileStore it never reuses a message key nor loses its session — the
// peer opens every ciphertext it printed and the ones sent after the
// restart.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import * as e from "../dist/e2ee/index.js";
import { FileStore } from "../dist/e2ee/filestore.js";

test("kill -9 during encryption: the reopened device goes on, the peer reads everything", async () => {
  const dir = mkdtempSync(join(tmpdir(), "parley-e2ee-crash-"));
  const A = { user: "alice", device: "a" };
  const B = { user: "bob", device: "b" };
  const bob = await e.Device.open(new e.MemoryStore(), B);
  const up = await bob.generateKeys(1);
  let st = await FileStore.open(dir);
  let alice = await e.Device.open(st, A);
  await alice.processBundle({ ...B, registrationId: up.registrationId, identityKey: up.identityKey, signedPreKey: up.signedPreKey, preKey: up.preKeys[0], kemPreKey: up.kemPreKeys[0] });
  const first = await alice.encrypt(B, e.utf8("first"));
  await bob.decrypt(A, first.type, first.body);
  const answer = await bob.encrypt(A, e.utf8("answer"));
  await alice.decrypt(B, answer.type, answer.body);
  await st.close();

  for (let round = 0; round < 6; round++) {
    const child = spawn(process.execPath, [new URL("./e2ee-crash-child.mjs", import.meta.url).pathname, dir], { stdio: ["ignore", "pipe", "inherit"] });
    const lines = [];
    const killAt = 3 + ((round * 17) % 40);
    await new Promise((res) => {
      createInterface({ input: child.stdout }).on("line", (l) => {
        lines.push(JSON.parse(l));
        if (lines.length === killAt) child.kill("SIGKILL");
      });
      child.on("exit", res);
    });
    assert.ok(lines.length >= killAt, `round ${round}: ${lines.length} ciphertexts before the kill`);
    // Out of order, as a network may deliver them.
    for (const l of [...lines].reverse()) {
      assert.equal(new TextDecoder().decode(await bob.decrypt(A, l.type, e.fromBase64(l.body))), "m" + l.i, `round ${round} message ${l.i}`);
    }
    st = await FileStore.open(dir); // the dead process's lock is taken over
    alice = await e.Device.open(st, A);
    const after = await alice.encrypt(B, e.utf8("after " + round));
    assert.equal(new TextDecoder().decode(await bob.decrypt(A, after.type, after.body)), "after " + round);
    const back = await bob.encrypt(A, e.utf8("back " + round));
    assert.equal(new TextDecoder().decode(await alice.decrypt(B, back.type, back.body)), "back " + round);
    await st.close();
  }
});
