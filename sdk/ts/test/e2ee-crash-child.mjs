// Encrypts to bob/b from the device in the FileStore at argv[2] until it
// is killed, printing each ciphertext (a JSON line) once it is stored.
import * as e from "../dist/e2ee/index.js";
import { FileStore } from "../dist/e2ee/filestore.js";

const d = await e.Device.open(await FileStore.open(process.argv[2]), { user: "alice", device: "a" });
for (let i = 0; ; i++) {
  const c = await d.encrypt({ user: "bob", device: "b" }, e.utf8("m" + i));
  process.stdout.write(JSON.stringify({ i, type: c.type, body: e.toBase64(c.body) }) + "\n");
}
