// The Double Ratchet (signal.org/docs/specifications/doubleratchet) with
// libsignal's limits, and the X3DH/PQXDH session setup, as client/e2ee has
// them. A session state is plain data (Uint8Arrays, numbers) that the
// device stores as JSON.

import { concat, equal } from "./bytes.js";
import { agree, generateKeyPair, KeyPair } from "./curve.js";
import { fail } from "./errors.js";
import {
  aesCBCDecrypt,
  aesCBCEncrypt,
  ChainKey,
  createChain,
  deriveInitial,
  deriveMessageKeys,
  messageSeed,
  nextChain,
} from "./kdf.js";
import { KEMKeyPair, kemDecapsulate, kemEncapsulate } from "./kem.js";
import {
  encodePreKey,
  MessageType,
  newSignalMessage,
  SignalMessage,
  TYPE_PREKEY,
  TYPE_SIGNAL,
  VERSION_PQXDH,
  VERSION_X3DH,
  verifyMAC,
} from "./messages.js";

// libsignal's limits (rust/protocol/src/consts.rs).
export const MAX_FORWARD_JUMP = 25000;
export const MAX_SKIPPED_KEYS = 2000;
export const MAX_RECEIVER_CHAINS = 5;
export const MAX_ARCHIVED_STATES = 40;

export interface SkippedKey {
  i: number;
  s: Uint8Array;
}

export interface ReceiverChain {
  ratchetKey: Uint8Array;
  chain: ChainKey;
  skipped: SkippedKey[]; // oldest first
}

export interface PendingPreKey {
  preKeyId?: number;
  signedPreKeyId: number;
  kyberPreKeyId?: number;
  kyberCiphertext?: Uint8Array;
  baseKey: Uint8Array;
}

export interface SessionState {
  version: number;
  localIdentity: Uint8Array;
  remoteIdentity: Uint8Array;
  root: Uint8Array;
  previousCounter: number;
  sender: { ratchet: KeyPair; chain: ChainKey };
  receivers: ReceiverChain[]; // oldest first
  pending?: PendingPreKey;
  localRegId: number;
  remoteRegId: number;
  baseKey: Uint8Array; // the initiator's base key: names the session
}

export function cloneState(s: SessionState): SessionState {
  return structuredClone(s);
}

const DISCONTINUITY = new Uint8Array(32).fill(0xff);

export interface AliceParams {
  identity: KeyPair;
  base: KeyPair;
  theirIdentity: Uint8Array;
  theirSignedPreKey: Uint8Array;
  theirOneTime?: Uint8Array;
  theirRatchet: Uint8Array;
  theirKEM?: Uint8Array; // absent: classic X3DH (version 3)
  sending?: KeyPair; // the first sending ratchet key (fresh unless given)
}

export function aliceSession(p: AliceParams): { state: SessionState; kct?: Uint8Array } {
  const parts = [
    DISCONTINUITY,
    agree(p.identity.priv, p.theirSignedPreKey),
    agree(p.base.priv, p.theirIdentity),
    agree(p.base.priv, p.theirSignedPreKey),
  ];
  if (p.theirOneTime) parts.push(agree(p.base.priv, p.theirOneTime));
  let version = VERSION_X3DH;
  let kct: Uint8Array | undefined;
  if (p.theirKEM) {
    const { ss, ct } = kemEncapsulate(p.theirKEM);
    parts.push(ss);
    kct = ct;
    version = VERSION_PQXDH;
  }
  const init = deriveInitial(concat(...parts), version === VERSION_PQXDH);
  const sending = p.sending ?? generateKeyPair();
  const step = createChain(init.root, p.theirRatchet, sending.priv);
  return {
    state: {
      version,
      localIdentity: p.identity.pub,
      remoteIdentity: p.theirIdentity,
      root: step.root,
      previousCounter: 0,
      sender: { ratchet: sending, chain: step.ck },
      receivers: [{ ratchetKey: p.theirRatchet, chain: init.ck, skipped: [] }],
      localRegId: 0,
      remoteRegId: 0,
      baseKey: p.base.pub,
    },
    kct,
  };
}

export interface BobParams {
  identity: KeyPair;
  signedPreKey: KeyPair;
  oneTime?: KeyPair;
  ratchet: KeyPair;
  kem?: KEMKeyPair;
  kemCiphertext?: Uint8Array;
  theirIdentity: Uint8Array;
  theirBaseKey: Uint8Array;
}

export function bobSession(p: BobParams): SessionState {
  const parts = [
    DISCONTINUITY,
    agree(p.signedPreKey.priv, p.theirIdentity),
    agree(p.identity.priv, p.theirBaseKey),
    agree(p.signedPreKey.priv, p.theirBaseKey),
  ];
  if (p.oneTime) parts.push(agree(p.oneTime.priv, p.theirBaseKey));
  let version = VERSION_X3DH;
  if (p.kem) {
    parts.push(kemDecapsulate(p.kem, p.kemCiphertext ?? new Uint8Array()));
    version = VERSION_PQXDH;
  }
  const init = deriveInitial(concat(...parts), version === VERSION_PQXDH);
  return {
    version,
    localIdentity: p.identity.pub,
    remoteIdentity: p.theirIdentity,
    root: init.root,
    previousCounter: 0,
    sender: { ratchet: p.ratchet, chain: init.ck },
    receivers: [],
    localRegId: 0,
    remoteRegId: 0,
    baseKey: p.theirBaseKey,
  };
}

// encrypt seals plain on s, advancing its sending chain.
export async function encryptOn(s: SessionState, plain: Uint8Array): Promise<{ type: MessageType; body: Uint8Array }> {
  const ck = s.sender.chain;
  const mk = deriveMessageKeys(messageSeed(ck));
  const ct = await aesCBCEncrypt(mk.cipher, mk.iv, plain);
  const msg = newSignalMessage(s.version, mk.mac, s.sender.ratchet.pub, ck.index, s.previousCounter, ct, s.localIdentity, s.remoteIdentity);
  s.sender.chain = nextChain(ck);
  if (!s.pending) return { type: TYPE_SIGNAL, body: msg.serialized };
  const body = encodePreKey({
    version: s.version,
    registrationId: s.localRegId,
    preKeyId: s.pending.preKeyId,
    signedPreKeyId: s.pending.signedPreKeyId,
    kyberPreKeyId: s.pending.kyberPreKeyId,
    kyberCiphertext: s.pending.kyberCiphertext,
    baseKey: s.pending.baseKey,
    identityKey: s.localIdentity,
    message: msg,
  });
  return { type: TYPE_PREKEY, body };
}

// decryptOn opens m on s. s must be a copy: on error it is left half-way
// and the caller drops it.
export async function decryptOn(s: SessionState, m: SignalMessage): Promise<Uint8Array> {
  if (m.version !== s.version) {
    throw fail("version", `unsupported message version: message version ${m.version} on a version ${s.version} session`);
  }
  let rc = s.receivers.find((r) => equal(r.ratchetKey, m.ratchetKey));
  if (!rc) {
    const recv = createChain(s.root, m.ratchetKey, s.sender.ratchet.priv);
    const next = generateKeyPair();
    const send = createChain(recv.root, m.ratchetKey, next.priv);
    s.root = send.root;
    s.receivers.push({ ratchetKey: m.ratchetKey, chain: recv.ck, skipped: [] });
    if (s.receivers.length > MAX_RECEIVER_CHAINS) s.receivers = s.receivers.slice(s.receivers.length - MAX_RECEIVER_CHAINS);
    s.previousCounter = Math.max(s.sender.chain.index, 1) - 1;
    s.sender = { ratchet: next, chain: send.ck };
    rc = s.receivers[s.receivers.length - 1];
  }
  const seed = chainSeed(rc, m.counter);
  const mk = deriveMessageKeys(seed);
  if (!verifyMAC(m, mk.mac, s.remoteIdentity, s.localIdentity)) throw fail("bad_mac", "bad message MAC");
  const plain = await aesCBCDecrypt(mk.cipher, mk.iv, m.ciphertext);
  delete s.pending;
  return plain;
}

// chainSeed returns the message key seed of counter, from the skipped keys
// or by advancing the chain (storing what it skips).
export function chainSeed(rc: { chain: ChainKey; skipped: SkippedKey[] }, counter: number): Uint8Array {
  if (counter < rc.chain.index) {
    const i = rc.skipped.findIndex((k) => k.i === counter);
    if (i >= 0) {
      const seed = rc.skipped[i].s;
      rc.skipped.splice(i, 1);
      return seed;
    }
    throw fail("duplicate", `duplicate message (message key already used): counter ${counter}, chain at ${rc.chain.index}`);
  }
  if (counter - rc.chain.index > MAX_FORWARD_JUMP) {
    throw fail("too_far_ahead", `message too far in the future: counter ${counter}, chain at ${rc.chain.index} (limit ${MAX_FORWARD_JUMP})`);
  }
  while (rc.chain.index < counter) {
    rc.skipped.push({ i: rc.chain.index, s: messageSeed(rc.chain) });
    rc.chain = nextChain(rc.chain);
  }
  if (rc.skipped.length > MAX_SKIPPED_KEYS) rc.skipped.splice(0, rc.skipped.length - MAX_SKIPPED_KEYS);
  const seed = messageSeed(rc.chain);
  rc.chain = nextChain(rc.chain);
  return seed;
}
