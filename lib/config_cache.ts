/**
 * Parsed configuration files, cached by the SHA-256 of their bytes in the state directory
 * (`cache/config-documents.json`): a command whose configuration file has not changed since the
 * last one skips loading and running the YAML parser (~35 ms of every start, see yaml.ts).
 *
 * What is cached is the document as plain data, before `${VAR}` interpolation and validation,
 * which run every time; only documents that survive a JSON round trip unchanged are cached. The
 * file holds the most recent entries only, is replaced atomically, and is an optimisation: any
 * failure to read or write it falls back to parsing.
 */
import { userStateDir } from "./paths.ts";
import { sha256Hex } from "./hash.ts";
import { loadYaml, parseYamlDocument, type YamlDocument } from "./yaml.ts";

const MAX_ENTRIES = 16;

function cacheFile(): string {
  return `${userStateDir()}/cache/config-documents.json`;
}

type Entries = Record<string, unknown>;

async function readEntries(path: string): Promise<Entries> {
  try {
    const parsed = JSON.parse(await Deno.readTextFile(path));
    return typeof parsed === "object" && parsed !== null && !Array.isArray(parsed) ? parsed : {};
  } catch {
    return {};
  }
}

/** `text` parsed as YAML: from the cache when these exact bytes were parsed before. */
export async function parsedDocument(text: string): Promise<YamlDocument> {
  const path = cacheFile();
  const key = await sha256Hex(text);
  const entries = await readEntries(path);
  if (Object.hasOwn(entries, key)) return { kind: "ok", value: entries[key] };
  await loadYaml();
  const parsed = parseYamlDocument(text);
  if (parsed.kind === "ok" && jsonSafe(parsed.value)) {
    await store(path, key, parsed.value, entries);
  }
  return parsed;
}

async function store(path: string, key: string, value: unknown, entries: Entries): Promise<void> {
  // Newest last; the oldest go first when the file is full.
  const kept = Object.entries(entries).filter(([k]) => k !== key).slice(-(MAX_ENTRIES - 1));
  const next = Object.fromEntries([...kept, [key, value]]);
  const partial = `${path}.${Deno.pid}.${crypto.randomUUID().slice(0, 8)}.tmp`;
  try {
    await Deno.mkdir(path.slice(0, path.lastIndexOf("/")), { recursive: true });
    await Deno.writeTextFile(partial, JSON.stringify(next), { mode: 0o600 });
    await Deno.rename(partial, path);
  } catch {
    // A cache that cannot be written is only slower next time. The partial file has a name of its
    // own that nothing reads, and is mostly absent (the write that failed never made it).
    await Deno.remove(partial).catch(() => {});
  }
}

/** Plain JSON data: what a JSON round trip returns unchanged (no undefined, NaN, Infinity…). */
function jsonSafe(value: unknown): boolean {
  if (value === null || typeof value === "string" || typeof value === "boolean") return true;
  if (typeof value === "number") return Number.isFinite(value);
  if (Array.isArray(value)) return value.every(jsonSafe);
  if (typeof value !== "object" || Object.getPrototypeOf(value) !== Object.prototype) return false;
  return Object.values(value as Record<string, unknown>).every(jsonSafe);
}
