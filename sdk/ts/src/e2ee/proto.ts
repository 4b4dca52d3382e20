// A minimal protobuf (proto2) codec for the flat messages of libsignal's
// wire.proto: only varint (uint32) and length-delimited (bytes) fields are
// written; unknown fields of every wire type are skipped on reading, and a
// field given twice keeps its last value, as protobuf requires.

import { concat } from "./bytes.js";

export class ProtoError extends Error {}

function varint(v: number): number[] {
  const out: number[] = [];
  let x = v;
  while (x >= 0x80) {
    out.push((x % 0x80) | 0x80);
    x = Math.floor(x / 0x80);
  }
  out.push(x);
  return out;
}

export class PbWriter {
  private parts: Uint8Array[] = [];
  raw(b: Uint8Array | number[]): this {
    this.parts.push(b instanceof Uint8Array ? b : Uint8Array.from(b));
    return this;
  }
  uint32(field: number, v: number): this {
    return this.raw([...varint(field * 8), ...varint(v >>> 0)]);
  }
  bytes(field: number, v: Uint8Array): this {
    this.raw([...varint(field * 8 + 2), ...varint(v.length)]);
    return this.raw(v);
  }
  finish(): Uint8Array {
    return concat(...this.parts);
  }
}

export interface PbField {
  wire: number;
  v: number; // varint and fixed values (fixed64 as far as a double holds it)
  bytes?: Uint8Array;
}

function readVarint(b: Uint8Array, o: number): [number, number] {
  let v = 0;
  let mul = 1;
  for (let i = 0; i < 10; i++) {
    if (o + i >= b.length) throw new ProtoError("e2ee: malformed protobuf");
    const c = b[o + i];
    v += (c & 0x7f) * mul;
    mul *= 0x80;
    if (c < 0x80) return [v, o + i + 1];
  }
  throw new ProtoError("e2ee: malformed protobuf");
}

export function pbParse(b: Uint8Array): Map<number, PbField> {
  const out = new Map<number, PbField>();
  let o = 0;
  while (o < b.length) {
    let tag: number;
    [tag, o] = readVarint(b, o);
    const num = Math.floor(tag / 8);
    const wire = tag % 8;
    if (num === 0 || num > 1 << 29) throw new ProtoError("e2ee: malformed protobuf");
    const f: PbField = { wire, v: 0 };
    switch (wire) {
      case 0:
        [f.v, o] = readVarint(b, o);
        break;
      case 1:
        if (o + 8 > b.length) throw new ProtoError("e2ee: malformed protobuf");
        f.v = -1; // never a valid uint32
        o += 8;
        break;
      case 2: {
        let l: number;
        [l, o] = readVarint(b, o);
        if (l > b.length - o) throw new ProtoError("e2ee: malformed protobuf");
        f.bytes = b.subarray(o, o + l);
        o += l;
        break;
      }
      case 5:
        if (o + 4 > b.length) throw new ProtoError("e2ee: malformed protobuf");
        f.v = -1;
        o += 4;
        break;
      default:
        throw new ProtoError("e2ee: malformed protobuf");
    }
    out.set(num, f);
  }
  return out;
}

// pbUint32: the field's value, undefined when absent; a field of another
// wire type or out of range throws.
export function pbUint32(m: Map<number, PbField>, field: number): number | undefined {
  const f = m.get(field);
  if (!f) return undefined;
  if (f.wire !== 0 || f.v > 0xffffffff || f.v < 0) throw new ProtoError("e2ee: malformed protobuf");
  return f.v;
}

export function pbBytes(m: Map<number, PbField>, field: number): Uint8Array | undefined {
  const f = m.get(field);
  if (!f) return undefined;
  if (f.wire !== 2 || !f.bytes) throw new ProtoError("e2ee: malformed protobuf");
  return f.bytes.slice();
}
