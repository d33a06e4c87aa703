/**
 * A short, safe summary of what a configuration file would change: shown when an untrusted project
 * file is ignored, and by `sandbox trust`, so that the user sees what they are being asked to trust.
 *
 * It reads the raw document (no `${VAR}` interpolation: the summary must never show a variable's
 * value) and tolerates any shape, since the file may be hostile or broken. Every value taken from the
 * file is quoted with control, C1 and bidirectional characters escaped, so that the file cannot
 * write terminal escapes to the user's screen through it.
 */
import { loadYaml, yaml, yamlDeferred } from "./yaml.ts";

// `summarizeConfig()` is synchronous: YAML is ready when this module is, unless the CLI deferred it.
if (!yamlDeferred()) await loadYaml();

const MAX_LINES = 24;
const MAX_VALUE_CHARS = 80;

/** A value from the file, quoted and made safe for a terminal. */
export function quoteForTerminal(value: unknown): string {
  let text = typeof value === "string" ? value : JSON.stringify(value) ?? String(value);
  if (text.length > MAX_VALUE_CHARS) text = `${text.slice(0, MAX_VALUE_CHARS)}…`;
  return JSON.stringify(text).replace(
    /[\u007f-\u009f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]/g,
    (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`,
  );
}

/** A name from the file: bare when it is a plain identifier, else quoted. */
function label(value: unknown): string {
  if (typeof value === "number" || typeof value === "boolean") return String(value);
  return typeof value === "string" && /^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,63}$/.test(value)
    ? value
    : quoteForTerminal(value);
}

/**
 * `path` as one shell word a user can paste: bare when plain, single-quoted otherwise, and ANSI-C
 * quoted (`$'…'`, bytes as `\xNN`) when it holds control characters, which must not reach the terminal.
 */
export function shellQuote(path: string): string {
  if (/^[A-Za-z0-9_\/.,:@%+=-]+$/.test(path)) return path;
  if (
    // deno-lint-ignore no-control-regex -- finding control characters is the point
    !/[\u0000-\u001f\u007f-\u009f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]/.test(
      path,
    )
  ) {
    return `'${path.replaceAll("'", `'\\''`)}'`;
  }
  const bytes = new TextEncoder().encode(path);
  const escaped = Array.from(
    bytes,
    (b) =>
      b >= 0x20 && b < 0x7f && b !== 0x27 && b !== 0x5c
        ? String.fromCharCode(b)
        : `\\x${b.toString(16).padStart(2, "0")}`,
  ).join("");
  return `$'${escaped}'`;
}

type Node = Record<string, unknown>;

function isObject(value: unknown): value is Node {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

function names(value: unknown): string[] {
  if (Array.isArray(value)) return value.map(label);
  if (isObject(value)) return Object.keys(value).map(label);
  return value === undefined ? [] : [label(value)];
}

function keySource(value: unknown): string {
  if (isObject(value) && "command" in value) {
    return "a command run on the host (never allowed in a project file)";
  }
  if (isObject(value) && "env" in value) {
    return `environment variable ${quoteForTerminal(value.env)}`;
  }
  return quoteForTerminal(value);
}

/**
 * What each profile of the document sets, one line per section; at most `MAX_LINES` lines. (The
 * yaml module must be loaded: see yaml.ts.)
 */
export function summarizeConfig(text: string): string[] {
  const parser = yaml();
  let doc: unknown;
  try {
    doc = parser.parse(text);
  } catch {
    return ["(not valid YAML)"];
  }
  if (!isObject(doc)) return ["(no settings)"];
  const lines: string[] = [];
  if (doc.default_profile !== undefined) {
    lines.push(`default_profile ${quoteForTerminal(doc.default_profile)}`);
  }
  const profiles = isObject(doc.profiles) ? doc.profiles : {};
  for (const [name, raw] of Object.entries(profiles)) {
    const where = `profile ${label(name)}:`;
    if (!isObject(raw)) {
      lines.push(`${where} defined`);
      continue;
    }
    const before = lines.length;
    const llm = isObject(raw.llm) ? raw.llm : {};
    const llmParts = [
      llm.provider !== undefined ? `provider ${quoteForTerminal(llm.provider)}` : "",
      llm.base_url !== undefined
        ? `base_url ${quoteForTerminal(llm.base_url)} (where your key is sent)`
        : "",
      llm.api !== undefined ? `api ${quoteForTerminal(llm.api)}` : "",
      llm.model !== undefined ? `model ${quoteForTerminal(llm.model)}` : "",
      llm.key !== undefined ? `key from ${keySource(llm.key)}` : "",
    ].filter(Boolean);
    if (llmParts.length) lines.push(`${where} llm ${llmParts.join(", ")}`);
    const git = isObject(raw.git) ? raw.git : {};
    if (git.token !== undefined) lines.push(`${where} git token from ${keySource(git.token)}`);
    const sandbox = isObject(raw.sandbox) ? raw.sandbox : {};
    if (sandbox.mode !== undefined) {
      const unsafe = sandbox.mode === "none"
        ? " (no isolation: the agent runs on this machine, as you)"
        : "";
      lines.push(`${where} sandbox.mode ${quoteForTerminal(sandbox.mode)}${unsafe}`);
    }
    if (sandbox.image !== undefined) {
      lines.push(`${where} image ${quoteForTerminal(sandbox.image)}`);
    }
    if (sandbox.pool !== undefined) lines.push(`${where} pool ${quoteForTerminal(sandbox.pool)}`);
    const network = isObject(sandbox.network) ? sandbox.network : {};
    const networkParts = [
      network.mode !== undefined
        ? `mode ${quoteForTerminal(network.mode)}${
          network.mode === "full" ? " (unrestricted outbound access)" : ""
        }`
        : "",
      network.allow !== undefined ? `allow ${names(network.allow).join(", ") || "nothing"}` : "",
      network.hosts !== undefined ? `hosts ${names(network.hosts).join(", ")}` : "",
    ].filter(Boolean);
    if (networkParts.length) lines.push(`${where} network ${networkParts.join(", ")}`);
    const environment = isObject(sandbox.environment) ? sandbox.environment : {};
    const envParts = [
      environment.passthrough !== undefined
        ? `passthrough ${names(environment.passthrough).join(", ")}`
        : "",
      environment.set !== undefined ? `set ${names(environment.set).join(", ")}` : "",
    ].filter(Boolean);
    if (envParts.length) lines.push(`${where} environment ${envParts.join("; ")}`);
    if (isObject(sandbox.resources)) {
      const resources = Object.entries(sandbox.resources).map(([k, v]) =>
        `${label(k)} ${label(v)}`
      );
      if (resources.length) lines.push(`${where} resources ${resources.join(", ")}`);
    }
    if (lines.length === before) lines.push(`${where} defined, with the defaults`);
  }
  if (lines.length === 0) return ["(no settings)"];
  return lines.length > MAX_LINES
    ? [...lines.slice(0, MAX_LINES), `… and ${lines.length - MAX_LINES} more`]
    : lines;
}
