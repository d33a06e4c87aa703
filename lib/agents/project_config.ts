/**
 * The configuration an agent CLI reads from the project it works in, which a repository can
 * commit: Claude Code's `.claude/` (settings with hooks, `env`, `apiKeyHelper`, plugins; skills,
 * agents and commands, which may carry hooks of their own) and `.mcp.json` (MCP servers: programs
 * it starts), Codex's `.codex/` (config, hooks, exec rules). A hook there ran with the prompt and
 * the session token, and `env.ANTHROPIC_BASE_URL` sent the agent's LLM calls elsewhere.
 *
 * Like a committed sandbox.yaml it is the repository's word, not the user's: the agent reads it
 * only once the user has trusted that content, every file of it (`sandbox trust`, by content hash:
 * lib/trust.ts). What is checked is the committed tree of the run's base commit — the tree the
 * sandbox receives — read once, here: a file that is not a regular file there (a symbolic link, a
 * submodule) is never trusted. Until then `launch.ts` keeps it out with each CLI's own switches.
 */
import { SandboxError } from "../errors.ts";
import { spawn } from "../process.ts";
import { trustStateOf, trustStorePath } from "../trust.ts";
import { quoteForTerminal, shellQuote } from "../config_summary.ts";
import type { AgentCliName } from "./packages.ts";

/** Where, relative to the project, an agent CLI reads configuration: a directory (all of it) or a file. */
export type ProjectConfigPath = ".claude" | ".mcp.json" | ".codex";

export interface ProjectConfigUnit {
  path: ProjectConfigPath;
  /** What the agent does with it, for messages. */
  what: string;
}

export const AGENT_PROJECT_CONFIG: Readonly<Record<AgentCliName, readonly ProjectConfigUnit[]>> = {
  "claude-code": [
    {
      path: ".claude",
      what: "Claude Code's project and local settings, skills, agents and commands",
    },
    { path: ".mcp.json", what: "the MCP servers Claude Code starts" },
  ],
  codex: [{ path: ".codex", what: "Codex's project configuration, hooks and rules" }],
};

/** Every path `sandbox trust` treats as agent configuration (the units and what is under them). */
export function isAgentConfigPath(relative: string): boolean {
  const first = relative.split("/")[0];
  return first === ".claude" || first === ".codex" || relative === ".mcp.json";
}

/**
 * `target` (resolved) when it is agent configuration in a repository on this machine: a unit or a
 * file under one, relative to the nearest directory above it that holds `.git`.
 */
export async function agentConfigUnit(target: string): Promise<string | undefined> {
  let path: string;
  try {
    path = await Deno.realPath(target);
  } catch {
    return undefined;
  }
  let dir = path;
  while (dir !== "/") {
    dir = dir.replace(/\/[^/]*$/, "") || "/";
    try {
      await Deno.lstat(`${dir === "/" ? "" : dir}/.git`);
    } catch {
      continue;
    }
    return isAgentConfigPath(path.slice(dir === "/" ? 1 : dir.length + 1)) ? path : undefined;
  }
  return undefined;
}

/** A committed file of a unit that is not used. */
export interface IgnoredAgentFile {
  /** Repository-relative path. */
  path: string;
  /** `changed`: another content of it was trusted. */
  state: "untrusted" | "changed" | "not a regular file";
  /** What it would change, one line each, safe for a terminal. */
  summary: string[];
}

export interface IgnoredAgentConfig {
  unit: ProjectConfigUnit;
  /** The unit on the host, for `sandbox trust`. */
  hostPath: string;
  files: IgnoredAgentFile[];
}

export interface AgentProjectConfig {
  /** Units the agent may read: in the commit, and every file of them trusted. */
  trusted: ProjectConfigPath[];
  /** Units in the commit that are not used, with the files that keep them out. */
  ignored: IgnoredAgentConfig[];
}

export interface AgentProjectConfigOptions {
  /** The trust store (default: the user's, lib/trust.ts). */
  trustStore?: string;
}

/** At most this many files of one unit are read; a unit with more is never used. */
const MAX_FILES = 512;
/** A file over this size is never used. */
const MAX_FILE_BYTES = 1024 * 1024;

interface TreeFile {
  path: string;
  mode: string;
  type: string;
  oid: string;
}

/**
 * Which of `agent`'s project configuration, committed at `base` in the repository at `repoPath`,
 * the user trusts. Nothing is trusted without a repository on this machine.
 */
export async function checkAgentProjectConfig(
  agent: AgentCliName,
  repo: { path: string; base: string } | undefined,
  options: AgentProjectConfigOptions = {},
): Promise<AgentProjectConfig> {
  const result: AgentProjectConfig = { trusted: [], ignored: [] };
  if (!repo) return result;
  const units = AGENT_PROJECT_CONFIG[agent];
  const listed = await committedFiles(repo, units.map((u) => u.path));
  for (const unit of units) {
    const files = listed.filter((f) => f.path === unit.path || f.path.startsWith(`${unit.path}/`));
    if (files.length === 0) continue;
    const ignored = await untrustedFiles(repo, files, options.trustStore ?? trustStorePath());
    if (ignored.length === 0) result.trusted.push(unit.path);
    else result.ignored.push({ unit, hostPath: `${repo.path}/${unit.path}`, files: ignored });
  }
  return result;
}

/** The files of `units` whose committed content the user has not trusted. */
async function untrustedFiles(
  repo: { path: string; base: string },
  files: TreeFile[],
  trustStore: string,
): Promise<IgnoredAgentFile[]> {
  if (files.length > MAX_FILES) {
    return [{
      path: files[0].path.split("/")[0],
      state: "not a regular file",
      summary: [`${files.length} files: more than ${MAX_FILES} are never used`],
    }];
  }
  const regular = files.filter((f) =>
    f.type === "blob" && (f.mode === "100644" || f.mode === "100755")
  );
  const ignored: IgnoredAgentFile[] = files.filter((f) => !regular.includes(f)).map((f) => ({
    path: f.path,
    state: "not a regular file",
    summary: [
      f.mode === "120000"
        ? "a symbolic link: never used"
        : `a ${f.type} (mode ${f.mode}): never used`,
    ],
  }));
  const contents = await readBlobs(repo.path, regular.map((f) => f.oid));
  for (const [i, file] of regular.entries()) {
    const bytes = contents[i];
    if (bytes === undefined) {
      ignored.push({
        path: file.path,
        state: "not a regular file",
        summary: [`over ${MAX_FILE_BYTES} bytes: never used`],
      });
      continue;
    }
    const state = await trustStateOf(`${repo.path}/${file.path}`, bytes, trustStore);
    if (state !== "trusted") {
      ignored.push({ path: file.path, state, summary: summarizeAgentFile(file.path, bytes) });
    }
  }
  return ignored;
}

/** `git ls-tree -r` of `paths` at the base commit: every file under them, with its mode and type. */
async function committedFiles(
  repo: { path: string; base: string },
  paths: string[],
): Promise<TreeFile[]> {
  const out = await git(repo.path, [
    "ls-tree",
    "-r",
    "-z",
    "--full-tree",
    repo.base,
    "--",
    ...paths,
  ]);
  return new TextDecoder().decode(out).split("\0").filter(Boolean).map((line) => {
    const tab = line.indexOf("\t");
    const [mode, type, oid] = line.slice(0, tab).split(" ");
    return { path: line.slice(tab + 1), mode, type, oid };
  });
}

/** The blobs' bytes, in order (one `git cat-file --batch`); `undefined` for one over the size cap. */
async function readBlobs(repoPath: string, oids: string[]): Promise<(Uint8Array | undefined)[]> {
  if (oids.length === 0) return [];
  const out = await git(repoPath, ["cat-file", "--batch"], oids.map((oid) => `${oid}\n`).join(""));
  const blobs: (Uint8Array | undefined)[] = [];
  let at = 0;
  for (const oid of oids) {
    const newline = out.indexOf(0x0a, at);
    const header = new TextDecoder().decode(out.subarray(at, newline)).split(" ");
    if (header[0] !== oid || header[1] !== "blob") {
      throw new SandboxError("exec_failed", `Cannot read ${oid} in "${repoPath}"`);
    }
    const size = Number(header[2]);
    blobs.push(size > MAX_FILE_BYTES ? undefined : out.slice(newline + 1, newline + 1 + size));
    at = newline + 1 + size + 1;
  }
  return blobs;
}

async function git(repoPath: string, args: string[], stdin?: string): Promise<Uint8Array> {
  const child = spawn(["git", "-C", repoPath, ...args], {
    env: { GIT_TERMINAL_PROMPT: "0" },
    stdin,
  });
  const [out, outcome] = await Promise.all([new Response(child.stdout).bytes(), child.finished]);
  if (outcome.exitCode !== 0) {
    throw new SandboxError(
      "exec_failed",
      `Cannot read the agent configuration in "${repoPath}": ${
        outcome.stderrTail.trim().split("\n")[0]
      }`,
    );
  }
  return out;
}

/** The lines a run prints for what it keeps out: each file, what it would change, and how to trust it. */
export function describeIgnored(agent: AgentCliName, config: AgentProjectConfig): string[] {
  const lines: string[] = [];
  for (const { unit, hostPath, files } of config.ignored) {
    lines.push(
      `ignoring ${
        shellQuote(hostPath)
      }, ${unit.what}: a configuration that comes with a project may be hostile`,
    );
    for (const file of files.slice(0, 16)) {
      if (file.state === "not a regular file") {
        lines.push(
          `  ${quoteForTerminal(file.path)}: ${
            file.summary.join("; ")
          }, and keeps ${unit.path} out while it is committed`,
        );
        continue;
      }
      const why = file.state === "changed" ? "changed since you trusted it" : "not trusted";
      lines.push(`  ${quoteForTerminal(file.path)} (${why}) would set:`);
      for (const line of file.summary) lines.push(`    ${line}`);
    }
    if (files.length > 16) lines.push(`  … and ${files.length - 16} more files`);
    lines.push(
      files.some((f) => f.state === "not a regular file")
        ? `  ${agent} runs without it: only regular files of reasonable size can be trusted`
        : `  ${agent} runs without it; after reviewing it, trust it with: sandbox trust ${
          shellQuote(hostPath)
        }`,
    );
  }
  return lines;
}

/** What a file of agent configuration would change, one line each; any shape is tolerated. */
export function summarizeAgentFile(path: string, bytes: Uint8Array): string[] {
  const text = new TextDecoder().decode(bytes);
  const name = path.split("/").pop() ?? path;
  if (path.endsWith(".json")) {
    let doc: unknown;
    try {
      doc = JSON.parse(text);
    } catch {
      return ["(not valid JSON)"];
    }
    if (!isObject(doc)) return ["(no settings)"];
    if (name === ".mcp.json") return mcpServers(doc.mcpServers);
    return jsonSettings(doc);
  }
  if (path.endsWith(".toml")) return tomlSettings(text);
  return [`${bytes.length} bytes the agent reads as project configuration`];
}

function isObject(value: unknown): value is Record<string, unknown> {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

function keys(value: unknown): string {
  return isObject(value)
    ? Object.keys(value).map(quoteForTerminal).join(", ")
    : quoteForTerminal(value);
}

/** Claude Code's settings, Codex's hooks.json: hooks, environment, helpers, then the other keys. */
function jsonSettings(doc: Record<string, unknown>): string[] {
  const lines: string[] = [];
  if (doc.hooks !== undefined) {
    lines.push(
      `hooks ${keys(doc.hooks)} (commands the agent runs, given the prompt, in its environment)`,
    );
  }
  if (doc.env !== undefined) {
    const redirect = isObject(doc.env) && Object.keys(doc.env).some((k) => /BASE_URL$/.test(k))
      ? "; a *_BASE_URL is where the agent's LLM calls go"
      : "";
    lines.push(`env ${keys(doc.env)} (the agent's environment${redirect})`);
  }
  for (
    const helper of [
      "apiKeyHelper",
      "awsAuthRefresh",
      "awsCredentialExport",
      "otelHeadersHelper",
      "statusLine",
    ]
  ) {
    if (doc[helper] !== undefined) {
      lines.push(`${helper} ${quoteForTerminal(doc[helper])} (a command the agent runs)`);
    }
  }
  if (doc.mcpServers !== undefined) lines.push(...mcpServers(doc.mcpServers));
  const known = new Set([
    "hooks",
    "env",
    "mcpServers",
    "apiKeyHelper",
    "awsAuthRefresh",
    "awsCredentialExport",
    "otelHeadersHelper",
    "statusLine",
  ]);
  const other = Object.keys(doc).filter((k) => !known.has(k));
  if (other.length > 0) lines.push(`also ${other.map(quoteForTerminal).join(", ")}`);
  return lines.length > 0 ? lines : ["(no settings)"];
}

function mcpServers(servers: unknown): string[] {
  if (!isObject(servers)) return ["(no MCP servers)"];
  return Object.entries(servers).map(([name, server]) => {
    const how = isObject(server) && server.command !== undefined
      ? `runs ${quoteForTerminal(server.command)}`
      : isObject(server) && server.url !== undefined
      ? `at ${quoteForTerminal(server.url)}`
      : "defined";
    return `MCP server ${quoteForTerminal(name)} (${how})`;
  });
}

/** A TOML file's top-level keys and tables, by a line scan (no value is interpreted). */
function tomlSettings(text: string): string[] {
  const top: string[] = [];
  const tables: string[] = [];
  let inTable = false;
  for (const line of text.split("\n")) {
    const header = line.match(/^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(#.*)?$/);
    if (header) {
      inTable = true;
      if (!tables.includes(header[1])) tables.push(header[1]);
      continue;
    }
    const key = line.match(/^\s*([A-Za-z0-9_."'-]+)\s*=/);
    if (key && !inTable) top.push(key[1]);
  }
  const lines: string[] = [];
  if (top.length > 0) lines.push(`sets ${top.map(quoteForTerminal).join(", ")}`);
  if (tables.length > 0) {
    lines.push(
      `tables ${tables.slice(0, 12).map(quoteForTerminal).join(", ")}${
        tables.length > 12 ? ", …" : ""
      }`,
    );
  }
  return lines.length > 0 ? lines : ["(no settings)"];
}
