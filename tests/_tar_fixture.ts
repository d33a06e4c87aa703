/**
 * Hand-built tar streams, for tests of the strict extractor (lib/tar_extract.ts): the headers an
 * attacker would write, byte by byte, with valid checksums unless a test breaks them.
 */

const encoder = new TextEncoder();

export interface MemberOptions {
  /** "0" file, "5" directory, "2" symlink, "1" hard link, "3"/"4" devices, "6" FIFO, "L", "K", "x"… */
  type?: string;
  mode?: number;
  mtime?: number;
  linkname?: string;
  /** The data after the header (padded to a block). */
  data?: Uint8Array | string;
  /** Header size when it differs from the data's (a lie, or a sparse member). */
  size?: number;
  /** "gnu" (default, what GNU tar writes) or "ustar" (POSIX, with its name prefix). */
  format?: "gnu" | "ustar";
  prefix?: string;
  /** Change the header block before its checksum is computed. */
  edit?: (block: Uint8Array) => void;
  /** Leave the checksum as computed plus this. */
  checksumOffset?: number;
}

function put(block: Uint8Array, start: number, length: number, text: string): void {
  const bytes = encoder.encode(text);
  if (bytes.byteLength > length) throw new RangeError(`"${text}" does not fit in ${length} bytes`);
  block.set(bytes, start);
}

export function octal(block: Uint8Array, start: number, length: number, value: number): void {
  put(block, start, length, value.toString(8).padStart(length - 1, "0") + "\0");
}

/** GNU base-256: the first byte 0x80, then the value big-endian. */
export function base256(block: Uint8Array, start: number, length: number, value: number): void {
  block.fill(0, start, start + length);
  block[start] = 0x80;
  let rest = BigInt(value);
  for (let i = start + length - 1; i > start; i--) {
    block[i] = Number(rest & 0xffn);
    rest >>= 8n;
  }
}

function padded(data: Uint8Array): Uint8Array {
  const out = new Uint8Array(Math.ceil(data.byteLength / 512) * 512);
  out.set(data);
  return out;
}

/** One header block and its data. */
export function member(name: string, options: MemberOptions = {}): Uint8Array {
  const data = typeof options.data === "string"
    ? encoder.encode(options.data)
    : options.data ?? new Uint8Array(0);
  const block = new Uint8Array(512);
  put(block, 0, 100, name);
  octal(block, 100, 8, options.mode ?? 0o644);
  octal(block, 108, 8, 10001);
  octal(block, 116, 8, 10001);
  octal(block, 124, 12, options.size ?? data.byteLength);
  octal(block, 136, 12, options.mtime ?? 1_700_000_000);
  block[156] = (options.type ?? "0").charCodeAt(0);
  put(block, 157, 100, options.linkname ?? "");
  if ((options.format ?? "gnu") === "gnu") {
    put(block, 257, 8, "ustar  \0");
  } else {
    put(block, 257, 8, "ustar\u000000");
    put(block, 345, 155, options.prefix ?? "");
  }
  put(block, 265, 32, "sandbox");
  put(block, 297, 32, "sandbox");
  options.edit?.(block);
  block.fill(0x20, 148, 156);
  const sum = block.reduce((a, b) => a + b, 0) + (options.checksumOffset ?? 0);
  put(block, 148, 8, sum.toString(8).padStart(6, "0") + "\0 ");
  return concat(block, padded(data));
}

export const file = (name: string, data: string | Uint8Array, options: MemberOptions = {}) =>
  member(name, { ...options, data });
export const dir = (name: string, options: MemberOptions = {}) =>
  member(name, { mode: 0o755, ...options, type: "5" });
export const symlink = (name: string, target: string) =>
  member(name, { type: "2", mode: 0o777, linkname: target });
export const hardlink = (name: string, target: string) =>
  member(name, { type: "1", linkname: target });

/** A GNU long name (`L`) or long link target (`K`) for the member that follows. */
export function longName(name: string, type: "L" | "K" = "L"): Uint8Array {
  return member("././@LongLink", { type, data: `${name}\0` });
}

/** A pax extended header (`x`) with these records. */
export function pax(records: Record<string, string>): Uint8Array {
  let body = "";
  for (const [key, value] of Object.entries(records)) {
    const rest = ` ${key}=${value}\n`;
    let length = encoder.encode(rest).byteLength + 1;
    while (String(length).length + encoder.encode(rest).byteLength !== length) length++;
    body += `${length}${rest}`;
  }
  return member("PaxHeaders/x", { type: "x", data: body, format: "ustar" });
}

/** The end of an archive: two zero blocks, then zeros up to a 10 KiB record, as GNU tar writes. */
export function end(parts: Uint8Array[]): Uint8Array {
  const length = parts.reduce((a, p) => a + p.byteLength, 0) + 1024;
  return new Uint8Array(Math.ceil(length / 10240) * 10240 - length + 1024);
}

/** Members and the end marker, as one archive. */
export function archive(...parts: Uint8Array[]): Uint8Array {
  return concat(...parts, end(parts));
}

export function concat(...parts: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((a, p) => a + p.byteLength, 0));
  let at = 0;
  for (const part of parts) {
    out.set(part, at);
    at += part.byteLength;
  }
  return out;
}

/** `bytes` in chunks of `size` (the last one shorter), as a stream. */
export function chunked(bytes: Uint8Array, size: number): ReadableStream<Uint8Array> {
  const chunks: Uint8Array[] = [];
  for (let at = 0; at < bytes.byteLength; at += size) chunks.push(bytes.slice(at, at + size));
  return ReadableStream.from(chunks);
}
