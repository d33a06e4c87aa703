/**
 * A strict tar extractor for archives a sandbox sends to the host (`copyOut`, `sandbox cp` out).
 *
 * The stream is the attacker's even though our own `tar -c` writes it: the agent can stop that
 * process and write its own headers into its stdout. So the host reads it with this module, never
 * with `tar -x` (which, run as root, creates the device nodes an archive names), and accepts only:
 *
 * | member | what the host creates |
 * |---|---|
 * | regular file (`0`, GNU sparse `S`) | a new file (never an existing path), holes kept as holes |
 * | directory (`5`) | a new directory |
 * | symbolic link (`2`) | a link with the archive's target, as written (it may point anywhere) |
 * | hard link (`1`) | only to a regular file this extraction created before it |
 * | GNU long name/link (`L`, `K`), pax header (`x`: path, linkpath, size, mtime) | the next member's fields |
 *
 * Anything else — character and block devices, FIFOs, global pax headers, pax sparse files, any
 * other type — fails the extraction naming the member and what it is, before anything of that
 * member exists. Names are relative, without `..`, at most `MAX_TAR_NAME_BYTES` long (255 bytes a
 * component), each used once; a member's directory must be a directory this extraction created
 * earlier (checked with lstat too), so nothing is ever written through a link, nor outside
 * `root`. Nothing is chowned (the invoking user owns everything); modes keep only the permission
 * bits (never setuid, setgid or sticky), less the process umask, as `tar --no-same-permissions`
 * would; modification times are kept. Headers must carry a valid checksum, a ustar or GNU magic,
 * and numbers in octal or GNU base-256; the archive must end with its two zero blocks, followed
 * by nothing but zeros. None of this depends on whether the host runs as root.
 *
 * The caller extracts into a fresh directory of its own (0700) and removes it when extraction
 * fails: a refused archive leaves nothing.
 */
import { ByteReader } from "./byte_reader.ts";
import { SandboxError } from "./errors.ts";

/** The longest member name or link target, in bytes (Linux's PATH_MAX). */
export const MAX_TAR_NAME_BYTES = 4096;
/** The most members one archive may hold (each becomes an inode on the host). */
export const MAX_TAR_ENTRIES = 1_000_000;
/** The most bytes all member names together may take (they are held while the archive is read). */
export const MAX_TAR_NAMES_BYTES = 128 * 1024 ** 2;
/** The only mode bits a member keeps. */
const PERMISSION_BITS = 0o777;
const BLOCK = 512;
const MAX_COMPONENT_BYTES = 255;
const MAX_PAX_BYTES = 64 * 1024;
/** Data segments of one sparse file (each costs the host a few dozen bytes while it is read). */
const MAX_SPARSE_SEGMENTS = 1 << 20;
const PIECE_BYTES = 1 << 20;

type Kind = "file" | "sparse" | "directory" | "symlink" | "hardlink";
const ENTRY_KINDS: Record<string, Kind> = {
  "0": "file",
  "\0": "file",
  S: "sparse",
  "5": "directory",
  "2": "symlink",
  "1": "hardlink",
};
const REFUSED_KINDS: Record<string, string> = {
  "3": "a character device",
  "4": "a block device",
  "6": "a FIFO",
  "7": "a contiguous file",
  D: "a GNU dump directory",
  M: "a multi-volume continuation",
  N: "an old GNU long name",
  V: "a volume label",
  g: "a global pax header",
};

export interface TarExtractOptions {
  /** Opens every error message, e.g. `Cannot copy "/workspace/x" out of sandbox "s"`. */
  what?: string;
  /** Every member must be this name or under it (the one thing asked for). */
  top?: string;
  maxNameBytes?: number;
  maxEntries?: number;
}

export interface TarExtractReport {
  /** Members created. */
  entries: number;
  /** Bytes read from the stream. */
  bytes: number;
}

/**
 * Extract the tar `stream` into the existing directory `root`, by the rules above. Fails with a
 * `SandboxError` (`exec_failed`) naming the refused member and why; the stream is then cancelled.
 */
export async function extractTar(
  stream: ReadableStream<Uint8Array>,
  root: string,
  options: TarExtractOptions = {},
): Promise<TarExtractReport> {
  const reader = new ByteReader(stream);
  const extraction = new Extraction(reader, root, options);
  try {
    const entries = await extraction.run();
    return { entries, bytes: reader.position };
  } catch (error) {
    // Stop the sender. A cancel that fails means the stream has already ended or failed, which
    // the caller learns from the sender itself: ignoring it loses nothing.
    reader.cancel(error).catch(() => {});
    throw error;
  }
}

interface Header {
  name: string;
  mode: number;
  size: number;
  mtime: number;
  type: string;
  linkname: string;
  gnu: boolean;
  block: Uint8Array;
}

/** What `L`, `K` and `x` headers say about the member that follows them. */
interface Meta {
  longName?: string;
  longLink?: string;
  pax?: Map<string, string>;
}

interface Entry {
  name: string;
  path: string;
  mode: number;
  size: number;
  mtime: number;
  kind: Kind;
  linkname: string;
  header: Header;
}

class Extraction {
  readonly #made = new Map<string, "directory" | "file" | "symlink">();
  readonly #directories: { abs: string; mode: number; mtime: number }[] = [];
  readonly #maxName: number;
  readonly #maxEntries: number;
  readonly #umask = processUmask();
  #nameBytes = 0;

  constructor(
    readonly reader: ByteReader,
    readonly root: string,
    readonly options: TarExtractOptions,
  ) {
    this.#maxName = options.maxNameBytes ?? MAX_TAR_NAME_BYTES;
    this.#maxEntries = options.maxEntries ?? MAX_TAR_ENTRIES;
  }

  fail(reason: string, entry?: string): SandboxError {
    const what = this.options.what ?? "Cannot extract the archive";
    return new SandboxError(
      "exec_failed",
      `${what}: ${entry === undefined ? "" : `${quote(entry)} `}${reason}`,
      {
        detail:
          "Nothing was written: only regular files, directories and symbolic links are copied out, inside the copy",
      },
    );
  }

  async run(): Promise<number> {
    const top = await Deno.lstat(this.root);
    if (!top.isDirectory) throw this.fail(`${quote(this.root)} is not a directory`);
    let meta: Meta = {};
    for (;;) {
      const block = await this.reader.exact(BLOCK);
      if (block.byteLength === 0) {
        throw this.fail("the archive ends without its end marker (truncated)");
      }
      if (block.byteLength < BLOCK) throw this.fail("the archive ends inside a header (truncated)");
      if (isZero(block)) {
        if (meta.longName !== undefined || meta.longLink !== undefined || meta.pax) {
          throw this.fail("the archive ends after a long name or pax header, without its member");
        }
        await this.#end();
        break;
      }
      const header = this.#header(block);
      if (header.type === "L" || header.type === "K" || header.type === "x") {
        meta = await this.#meta(header, meta);
        continue;
      }
      const entry = this.#entry(header, meta);
      meta = {};
      if (this.#made.size >= this.#maxEntries) {
        throw this.fail(`holds more than ${this.#maxEntries} members`, "the archive");
      }
      await this.#extract(entry);
    }
    for (const directory of this.#directories.reverse()) {
      await this.#fs(directory.abs, async () => {
        await Deno.chmod(directory.abs, directory.mode);
        await Deno.utime(directory.abs, new Date(), directory.mtime);
      });
    }
    return this.#made.size;
  }

  /** The second zero block, and nothing but zeros after it. */
  async #end(): Promise<void> {
    const second = await this.reader.exact(BLOCK);
    if (second.byteLength < BLOCK) {
      throw this.fail("the archive ends after a single zero block (truncated)");
    }
    if (!isZero(second)) throw this.fail("the archive has data after a zero block");
    for (;;) {
      const piece = await this.reader.some(PIECE_BYTES);
      if (!piece) return;
      if (!isZero(piece)) throw this.fail("the archive has data after its end marker");
    }
  }

  #header(block: Uint8Array): Header {
    const at = `the header at byte ${this.reader.position - BLOCK}`;
    const stored = numberField(block, 148, 8);
    let unsigned = 0;
    let signed = 0;
    for (let i = 0; i < BLOCK; i++) {
      const byte = i >= 148 && i < 156 ? 0x20 : block[i];
      unsigned += byte;
      signed += byte > 127 ? byte - 256 : byte;
    }
    if (stored === undefined || (stored !== unsigned && stored !== signed)) {
      throw this.fail(`${at} has a bad checksum`);
    }
    const magic = latin1(block.subarray(257, 265));
    const gnu = magic === "ustar  \0";
    if (!gnu && magic !== "ustar\u000000") {
      throw this.fail(`${at} is not a ustar or GNU tar header`);
    }
    const name = this.#text(block.subarray(0, 100), at);
    const prefix = gnu ? "" : this.#text(block.subarray(345, 500), at);
    const mode = numberField(block, 100, 8);
    const size = numberField(block, 124, 12);
    const mtime = numberField(block, 136, 12);
    if (mode === undefined || size === undefined || mtime === undefined) {
      throw this.fail(`${at} has a malformed number`);
    }
    return {
      name: prefix ? `${prefix}/${name}` : name,
      mode,
      size,
      mtime,
      type: String.fromCharCode(block[156]),
      linkname: this.#text(block.subarray(157, 257), at),
      gnu,
      block,
    };
  }

  /** A NUL-terminated UTF-8 field. */
  #text(field: Uint8Array, at: string): string {
    const end = field.indexOf(0);
    return this.#utf8(end === -1 ? field : field.subarray(0, end), at);
  }

  #utf8(bytes: Uint8Array, at: string): string {
    try {
      return new TextDecoder("utf-8", { fatal: true }).decode(bytes);
    } catch {
      throw this.fail(`${at} has a name that is not UTF-8`);
    }
  }

  /** A GNU long name or link (`L`, `K`) or a pax header (`x`), for the member that follows. */
  async #meta(header: Header, meta: Meta): Promise<Meta> {
    const limit = header.type === "x" ? MAX_PAX_BYTES : this.#maxName + 1;
    const at = `the ${header.type === "x" ? "pax header" : "long name"} at byte ${
      this.reader.position - BLOCK
    }`;
    if (header.size > limit) throw this.fail(`${at} is longer than ${limit} bytes`);
    const body = await this.#body(header.size, at);
    if (header.type === "x") {
      if (meta.pax) throw this.fail(`${at} follows another one`);
      return { ...meta, pax: this.#pax(body, at) };
    }
    const end = body.indexOf(0);
    if (end !== -1 && body.subarray(end).some((b) => b !== 0)) throw this.fail(`${at} holds a NUL`);
    const text = this.#utf8(end === -1 ? body : body.subarray(0, end), at);
    const key = header.type === "L" ? "longName" : "longLink";
    if (meta[key] !== undefined) throw this.fail(`${at} follows another one`);
    return { ...meta, [key]: text };
  }

  /** `size` bytes of a member's body, and its padding to the next block. */
  async #body(size: number, at: string): Promise<Uint8Array> {
    const padded = Math.ceil(size / BLOCK) * BLOCK;
    const body = await this.reader.exact(padded);
    if (body.byteLength < padded) throw this.fail(`the archive ends inside ${at} (truncated)`);
    return body.subarray(0, size);
  }

  /** Pax records `LEN key=value\n`: the keys that shape a member, others ignored, sparse refused. */
  #pax(body: Uint8Array, at: string): Map<string, string> {
    const records = new Map<string, string>();
    let offset = 0;
    while (offset < body.byteLength) {
      const space = body.indexOf(0x20, offset);
      const length = space === -1 ? "" : latin1(body.subarray(offset, space));
      const end = offset + Number(length);
      if (!/^[1-9][0-9]{0,5}$/.test(length) || end > body.byteLength || body[end - 1] !== 0x0a) {
        throw this.fail(`${at} has a malformed record`);
      }
      const record = body.subarray(space + 1, end - 1);
      const equals = record.indexOf(0x3d);
      if (equals <= 0) throw this.fail(`${at} has a malformed record`);
      const key = this.#utf8(record.subarray(0, equals), at);
      const value = this.#utf8(record.subarray(equals + 1), at);
      if (records.has(key)) throw this.fail(`${at} names "${key}" twice`);
      if (key.startsWith("GNU.sparse.")) {
        throw this.fail(`${at} describes a pax sparse file, which is not supported`);
      }
      if ((key === "path" || key === "linkpath") && value.includes("\0")) {
        throw this.fail(`${at} has a ${key} holding a NUL`);
      }
      if (key === "size" && !/^[0-9]{1,15}$/.test(value)) {
        throw this.fail(`${at} has a malformed size`);
      }
      if (key === "mtime" && !/^-?[0-9]{1,15}(\.[0-9]{1,9})?$/.test(value)) {
        throw this.fail(`${at} has a malformed mtime`);
      }
      records.set(key, value);
      offset = end;
    }
    return records;
  }

  /** The member a header describes, with what the headers before it said; its name checked. */
  #entry(header: Header, meta: Meta): Entry {
    const paxPath = meta.pax?.get("path");
    const paxLink = meta.pax?.get("linkpath");
    if (
      (paxPath !== undefined && meta.longName !== undefined) ||
      (paxLink !== undefined && meta.longLink !== undefined)
    ) {
      throw this.fail("has both a GNU long name and a pax one", header.name);
    }
    const name = paxPath ?? meta.longName ?? header.name;
    const size = meta.pax?.has("size") ? Number(meta.pax.get("size")) : header.size;
    const mtime = meta.pax?.has("mtime") ? Number(meta.pax.get("mtime")) : header.mtime;
    const kind = ENTRY_KINDS[header.type];
    if (!kind) {
      const what = REFUSED_KINDS[header.type] ?? `of tar type ${JSON.stringify(header.type)}`;
      throw this.fail(`is ${what}: refused`, name);
    }
    if (kind === "sparse" && !header.gnu) {
      throw this.fail("is a sparse file in a header that is not GNU", name);
    }
    if (kind !== "file" && kind !== "sparse" && size !== 0) {
      throw this.fail(`is a ${kind} that carries data`, name);
    }
    const parts = this.#parts(name);
    if (this.options.top !== undefined && parts[0] !== this.options.top) {
      throw this.fail(`is outside ${quote(this.options.top)}, the one thing copied`, name);
    }
    return {
      name,
      path: parts.join("/"),
      mode: header.mode,
      size,
      mtime,
      kind,
      linkname: paxLink ?? meta.longLink ?? header.linkname,
      header,
    };
  }

  /** A member name's components: relative, no `..`, within the length caps. */
  #parts(name: string): string[] {
    const bytes = new TextEncoder().encode(name).byteLength;
    if (bytes > this.#maxName) {
      throw this.fail(`has a name longer than ${this.#maxName} bytes`, name);
    }
    if (name.startsWith("/")) throw this.fail("has an absolute name: refused", name);
    const parts = name.split("/").filter((part) => part !== "" && part !== ".");
    if (parts.includes("..")) throw this.fail('has a ".." component: refused', name);
    if (parts.length === 0) throw this.fail("names the destination itself", name);
    if (parts.some((part) => new TextEncoder().encode(part).byteLength > MAX_COMPONENT_BYTES)) {
      throw this.fail(`has a component longer than ${MAX_COMPONENT_BYTES} bytes`, name);
    }
    this.#nameBytes += bytes;
    if (this.#nameBytes > MAX_TAR_NAMES_BYTES) {
      throw this.fail(`has names longer than ${MAX_TAR_NAMES_BYTES} bytes in all`, "the archive");
    }
    return parts;
  }

  /** Create one member, in a place checked first. */
  async #extract(entry: Entry): Promise<void> {
    const abs = await this.#place(entry);
    switch (entry.kind) {
      case "file":
      case "sparse":
        await this.#file(abs, entry);
        break;
      case "directory":
        await this.#fs(entry.name, () => Deno.mkdir(abs, { mode: 0o700 }));
        this.#made.set(entry.path, "directory");
        this.#directories.push({ abs, mode: this.#mode(entry.mode), mtime: entry.mtime });
        break;
      case "symlink": {
        const bytes = new TextEncoder().encode(entry.linkname).byteLength;
        if (bytes === 0 || bytes > this.#maxName) {
          throw this.fail(`is a symbolic link with a target of ${bytes} bytes`, entry.name);
        }
        await this.#fs(entry.name, () => Deno.symlink(entry.linkname, abs));
        this.#made.set(entry.path, "symlink");
        break;
      }
      case "hardlink": {
        const target = this.#parts(entry.linkname).join("/");
        if (this.#made.get(target) !== "file") {
          throw this.fail(
            `is a hard link to ${
              quote(entry.linkname)
            }, which is not a file extracted before it: refused`,
            entry.name,
          );
        }
        await this.#fs(entry.name, () => Deno.link(`${this.root}/${target}`, abs));
        this.#made.set(entry.path, "file");
        break;
      }
    }
  }

  /**
   * The host path for `entry`: a name not used before, in a directory this extraction made (never
   * a link, nor a file), which lstat confirms is a directory.
   */
  async #place(entry: Entry): Promise<string> {
    if (this.#made.has(entry.path)) {
      throw this.fail("is named twice in the archive: refused", entry.name);
    }
    const slash = entry.path.lastIndexOf("/");
    const parent = slash === -1 ? "" : entry.path.slice(0, slash);
    if (parent !== "") {
      const made = this.#made.get(parent);
      if (made === "symlink") {
        throw this.fail(
          `is inside ${quote(parent)}, a symbolic link: nothing is written through a link`,
          entry.name,
        );
      }
      if (made !== "directory") {
        throw this.fail(`comes without its directory ${quote(parent)} before it`, entry.name);
      }
    }
    const dir = parent === "" ? this.root : `${this.root}/${parent}`;
    const info = await this.#fs(entry.name, () => Deno.lstat(dir));
    if (!info.isDirectory) {
      throw this.fail(`is inside ${quote(parent)}, which is no longer a directory`, entry.name);
    }
    return `${this.root}/${entry.path}`;
  }

  /** A regular file (GNU sparse ones with their holes), created new, its mode set last. */
  async #file(abs: string, entry: Entry): Promise<void> {
    const segments = entry.kind === "sparse" ? await this.#sparseMap(entry) : undefined;
    const file = await this.#fs(
      entry.name,
      () => Deno.open(abs, { write: true, createNew: true, mode: 0o600 }),
    );
    try {
      this.#made.set(entry.path, "file");
      if (segments) {
        for (const segment of segments.list) {
          await file.seek(segment.offset, Deno.SeekMode.Start);
          await this.#copy(file, segment.length, entry);
        }
        await file.truncate(segments.realSize);
      } else {
        await this.#copy(file, entry.size, entry);
      }
      const padding = (BLOCK - (entry.size % BLOCK)) % BLOCK;
      if ((await this.reader.exact(padding)).byteLength < padding) {
        throw this.fail("ends inside its data (truncated)", entry.name);
      }
      await this.#fs(entry.name, async () => {
        await file.utime(new Date(), entry.mtime);
        const [opened, named] = await Promise.all([file.stat(), Deno.lstat(abs)]);
        if (!named.isFile || named.ino !== opened.ino || named.dev !== opened.dev) {
          throw new Error("replaced while it was written");
        }
        await Deno.chmod(abs, this.#mode(entry.mode));
      });
    } finally {
      file.close();
    }
  }

  /** `length` bytes of the stream into `file`. */
  async #copy(file: Deno.FsFile, length: number, entry: Entry): Promise<void> {
    let left = length;
    while (left > 0) {
      const piece = await this.reader.some(Math.min(left, PIECE_BYTES));
      if (!piece) throw this.fail("ends inside its data (truncated)", entry.name);
      let written = 0;
      while (written < piece.byteLength) {
        written += await this.#fs(entry.name, () => file.write(piece.subarray(written)));
      }
      left -= piece.byteLength;
    }
  }

  /** An old-GNU sparse map: four segments in the header, 21 more in each extension block. */
  async #sparseMap(
    entry: Entry,
  ): Promise<{ list: { offset: number; length: number }[]; realSize: number }> {
    const list: { offset: number; length: number }[] = [];
    const read = (block: Uint8Array, start: number, count: number) => {
      for (let i = 0; i < count; i++) {
        const at = start + 24 * i;
        if (block[at] === 0) return;
        const offset = numberField(block, at, 12);
        const length = numberField(block, at + 12, 12);
        if (offset === undefined || length === undefined) {
          throw this.fail("has a malformed sparse map", entry.name);
        }
        if (list.length >= MAX_SPARSE_SEGMENTS) {
          throw this.fail(`has more than ${MAX_SPARSE_SEGMENTS} sparse segments`, entry.name);
        }
        list.push({ offset, length });
      }
    };
    const block = entry.header.block;
    read(block, 386, 4);
    let extended = block[482] !== 0;
    while (extended) {
      const more = await this.reader.exact(BLOCK);
      if (more.byteLength < BLOCK) {
        throw this.fail("ends inside its sparse map (truncated)", entry.name);
      }
      read(more, 0, 21);
      extended = more[504] !== 0;
    }
    const realSize = numberField(block, 483, 12);
    let end = 0;
    let stored = 0;
    for (const segment of list) {
      if (
        realSize === undefined || segment.offset < end || segment.offset + segment.length > realSize
      ) {
        throw this.fail("has a sparse map out of order or past its size", entry.name);
      }
      end = segment.offset + segment.length;
      stored += segment.length;
    }
    if (realSize === undefined || stored !== entry.size) {
      throw this.fail("has a sparse map that does not match its data", entry.name);
    }
    return { list, realSize };
  }

  #mode(mode: number): number {
    return mode & PERMISSION_BITS & ~this.#umask;
  }

  /** A filesystem call for `entry`: its failure names the member. */
  async #fs<T>(entry: string, call: () => Promise<T>): Promise<T> {
    try {
      return await call();
    } catch (error) {
      if (error instanceof SandboxError) throw error;
      throw this.fail(`cannot be written on the host: ${(error as Error).message}`, entry);
    }
  }
}

/** A tar number: octal (leading spaces, trailing NULs or spaces), or GNU base-256 (positive only). */
function numberField(block: Uint8Array, start: number, length: number): number | undefined {
  const field = block.subarray(start, start + length);
  if (field[0] & 0x80) {
    if (field[0] & 0x40) return undefined;
    let value = field[0] & 0x3f;
    for (let i = 1; i < field.byteLength; i++) {
      value = value * 256 + field[i];
      if (value > Number.MAX_SAFE_INTEGER) return undefined;
    }
    return value;
  }
  const match = /^ *([0-7]*)[ \0]*$/.exec(latin1(field));
  if (!match) return undefined;
  const value = match[1] === "" ? 0 : parseInt(match[1], 8);
  return value <= Number.MAX_SAFE_INTEGER ? value : undefined;
}

function latin1(bytes: Uint8Array): string {
  return String.fromCharCode(...bytes);
}

function isZero(bytes: Uint8Array): boolean {
  for (let i = 0; i < bytes.byteLength; i++) if (bytes[i] !== 0) return false;
  return true;
}

/** A name in a message: JSON-quoted (control characters escaped), long ones cut. */
function quote(name: string): string {
  return JSON.stringify(name.length > 200 ? `${name.slice(0, 200)}…` : name);
}

/**
 * This process's umask, from /proc (reading it with umask(2) would set it for a moment, for every
 * thread creating files meanwhile); 022 where /proc does not say.
 */
function processUmask(): number {
  try {
    const match = /^Umask:\s*([0-7]+)$/m.exec(Deno.readTextFileSync("/proc/self/status"));
    if (match) return parseInt(match[1], 8);
  } catch {
    // No /proc (not Linux): the usual default.
  }
  return 0o022;
}
