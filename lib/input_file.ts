/**
 * Files the user names (a prompt, instructions, a schema, a recording, a configuration), read with
 * a bound: at most one byte past the limit is ever read, whatever the file is — a regular file, a
 * FIFO or process substitution (`<(...)`), a character device (`/dev/zero`), or stdin. A regular
 * file whose size is already past the limit is refused before any of it is read.
 */
import { SandboxError } from "./errors.ts";
import type { Profile } from "./config.ts";
import { formatBytes, parseSize } from "./units.ts";

const MIB = 1024 * 1024;

/**
 * A prompt (file or stdin) and an instructions file, each: what one LLM request carries with room
 * to spare under the credential proxy's default `llm.max_request_body` (10m).
 */
export const MAX_PROMPT_BYTES = 4 * MIB;
/** A JSON Schema for `run generate --schema`. */
export const MAX_SCHEMA_BYTES = 1 * MIB;
/** A recording for `--model replay:FILE` (every recorded answer, held in memory for the run). */
export const MAX_RECORDING_BYTES = 64 * MIB;
/** A configuration file (named, project or user). */
export const MAX_CONFIG_BYTES = 1 * MIB;

/** `llm.max_request_body`'s default (the configuration's schema always fills it in). */
const DEFAULT_MAX_REQUEST_BODY_BYTES = 10 * MIB;

/** Bytes read per call: enough for a small file in one read, a small step past the limit at worst. */
const CHUNK_BYTES = 64 * 1024;

/** A limit as the documentation writes it: "4 MiB", not "4.0 MiB". */
export function formatLimit(bytes: number): string {
  return bytes % MIB === 0 ? `${bytes / MIB} MiB` : formatBytes(bytes);
}

/** What reading a named file with a bound gave. */
export type BoundedRead =
  | { kind: "ok"; bytes: Uint8Array }
  | { kind: "too_large" }
  | { kind: "unreadable"; reason: string };

/** `path`'s bytes if there are at most `maxBytes` of them. */
export async function readBounded(path: string, maxBytes: number): Promise<BoundedRead> {
  let file: Deno.FsFile;
  try {
    file = await Deno.open(path, { read: true });
  } catch (error) {
    return {
      kind: "unreadable",
      reason: error instanceof Deno.errors.NotFound ? "file not found" : (error as Error).message,
    };
  }
  using _ = file;
  try {
    const info = await file.stat();
    if (info.isDirectory) return { kind: "unreadable", reason: "it is a directory" };
    // A device or FIFO reports size 0: only a regular file's size says anything.
    if (info.isFile && info.size > maxBytes) return { kind: "too_large" };
    return await readAtMost(file, maxBytes);
  } catch (error) {
    return { kind: "unreadable", reason: (error as Error).message };
  }
}

/** Stdin's bytes (a pipe, a file, a terminal until end of input) if there are at most `maxBytes`. */
export async function readStdinBounded(maxBytes: number): Promise<BoundedRead> {
  try {
    return await readAtMost(Deno.stdin, maxBytes);
  } catch (error) {
    return { kind: "unreadable", reason: (error as Error).message };
  }
}

async function readAtMost(
  reader: { read(buffer: Uint8Array): Promise<number | null> },
  maxBytes: number,
): Promise<BoundedRead> {
  const chunks: Uint8Array[] = [];
  let total = 0;
  for (;;) {
    const buffer = new Uint8Array(Math.min(CHUNK_BYTES, maxBytes + 1 - total));
    const n = await reader.read(buffer);
    if (n === null) break;
    chunks.push(buffer.subarray(0, n));
    total += n;
    if (total > maxBytes) return { kind: "too_large" };
  }
  const bytes = new Uint8Array(total);
  let offset = 0;
  for (const chunk of chunks) {
    bytes.set(chunk, offset);
    offset += chunk.length;
  }
  return { kind: "ok", bytes };
}

/**
 * The offset of the first byte that does not belong to well-formed UTF-8 (the start of the bad
 * sequence), or -1 when `bytes` is all UTF-8. The rules are those of the WHATWG decoder: no
 * overlong forms, no surrogates, nothing past U+10FFFF, no sequence cut short.
 */
export function invalidUtf8Offset(bytes: Uint8Array): number {
  let i = 0;
  while (i < bytes.length) {
    const lead = bytes[i];
    if (lead < 0x80) {
      i++;
      continue;
    }
    let need: number;
    let lower = 0x80;
    let upper = 0xbf;
    if (lead >= 0xc2 && lead <= 0xdf) need = 1;
    else if (lead >= 0xe0 && lead <= 0xef) {
      need = 2;
      if (lead === 0xe0) lower = 0xa0;
      if (lead === 0xed) upper = 0x9f;
    } else if (lead >= 0xf0 && lead <= 0xf4) {
      need = 3;
      if (lead === 0xf0) lower = 0x90;
      if (lead === 0xf4) upper = 0x8f;
    } else return i;
    for (let k = 1; k <= need; k++) {
      const next = bytes[i + k];
      if (next === undefined || next < lower || next > upper) return i;
      lower = 0x80;
      upper = 0xbf;
    }
    i += need + 1;
  }
  return -1;
}

/** `bytes` as text, or the offset of the first byte that is not UTF-8. */
export function decodeUtf8(
  bytes: Uint8Array,
): { kind: "ok"; text: string } | { kind: "invalid"; offset: number } {
  try {
    return { kind: "ok", text: new TextDecoder("utf-8", { fatal: true }).decode(bytes) };
  } catch (error) {
    // The fast decoder says only that something is wrong; the scan says where.
    if (!(error instanceof TypeError)) throw error;
    return { kind: "invalid", offset: invalidUtf8Offset(bytes) };
  }
}

/** How a usage error names an input: `prompt file "p.txt"`, or `prompt on stdin`. */
export interface InputName {
  /** What the file is, in lower case: "prompt file", "recording". */
  what: string;
  /** How stdin (`-`) is named instead: "prompt on stdin". */
  stdin?: string;
  /** What the limit is for, when not `what`: "prompt" (for a file and stdin alike). */
  limitFor?: string;
}

function named(path: string, name: InputName): string {
  return path === "-" && name.stdin ? name.stdin : `${name.what} "${path}"`;
}

/** The sentence a usage error starts with when an input is past its limit. */
export function tooLargeMessage(path: string, name: InputName, maxBytes: number): string {
  const subject = named(path, name);
  return `${subject[0].toUpperCase()}${subject.slice(1)} is larger than ${
    formatLimit(maxBytes)
  }, the limit for a ${name.limitFor ?? name.what}`;
}

/**
 * `path`'s bytes ("-" is stdin, when `name.stdin` says how to call it), at most `maxBytes`: a usage
 * error (exit 2) naming the file and the problem otherwise.
 */
export async function readInputBytes(
  path: string,
  maxBytes: number,
  name: InputName,
): Promise<Uint8Array> {
  const read = path === "-" && name.stdin
    ? await readStdinBounded(maxBytes)
    : await readBounded(path, maxBytes);
  if (read.kind === "too_large") {
    throw new SandboxError("usage", tooLargeMessage(path, name, maxBytes));
  }
  if (read.kind === "unreadable") {
    throw new SandboxError("usage", `Cannot read ${named(path, name)}: ${read.reason}`);
  }
  return read.bytes;
}

/** `readInputBytes`, as UTF-8 text: a usage error naming the first byte that is not UTF-8. */
export async function readInputText(
  path: string,
  maxBytes: number,
  name: InputName,
): Promise<string> {
  const decoded = decodeUtf8(await readInputBytes(path, maxBytes, name));
  if (decoded.kind === "invalid") {
    const subject = named(path, name);
    throw new SandboxError(
      "usage",
      `${subject[0].toUpperCase()}${
        subject.slice(1)
      } is not UTF-8 text: invalid byte at offset ${decoded.offset}`,
    );
  }
  return decoded.text;
}

/**
 * A prompt and its instructions must fit in the LLM request that carries them, with room for what
 * the agent adds (its system prompt, tool definitions, the JSON around them): together at most
 * `MAX_PROMPT_BYTES`, and at most half of the profile's `llm.max_request_body`, which the
 * credential proxy enforces (413) once the run has started. A usage error otherwise.
 */
export function checkPromptFits(
  prompt: string,
  options: { instructions?: string; profile: Pick<Profile, "name" | "llm"> },
): void {
  const { instructions, profile } = options;
  const maxRequestBodyBytes = parseSize(profile.llm.max_request_body) ??
    DEFAULT_MAX_REQUEST_BODY_BYTES;
  const encoder = new TextEncoder();
  const bytes = encoder.encode(prompt).length +
    (instructions ? encoder.encode(instructions).length : 0);
  const share = Math.floor(maxRequestBodyBytes / 2);
  if (bytes <= Math.min(MAX_PROMPT_BYTES, share)) return;
  const what = instructions ? "The prompt with its instructions" : "The prompt";
  const limit = share < MAX_PROMPT_BYTES
    ? `${formatLimit(share)}, half of profiles.${profile.name}.llm.max_request_body (${
      formatLimit(maxRequestBodyBytes)
    })`
    : `${formatLimit(MAX_PROMPT_BYTES)}, the limit for a prompt`;
  throw new SandboxError(
    "usage",
    `${what} (${formatBytes(bytes)}) is too large for an LLM request: at most ${limit}`,
  );
}
