/**
 * `sandbox mcp`: a Model Context Protocol server on stdio whose tools give an MCP client (Claude
 * Code, Codex, an IDE assistant) sandboxes to work in, one environment per task (environment.ts).
 *
 * The server owns every environment it opened: when the client disconnects (its input ends) or
 * the server is stopped (`signal`), each one is ended — running commands killed, the sandbox
 * released, nothing brought back — before `serveMcp` returns.
 */
import type { Readable, Writable } from "node:stream";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { z } from "zod";
import type { Profile } from "../config.ts";
import { SandboxError } from "../errors.ts";
import { KeyStore } from "../keys.ts";
import { Redactor } from "../redact.ts";
import { resolveLocalRepo } from "../repo/local.ts";
import { agenticMessage } from "../run/protocol.ts";
import { type Environment, openEnvironment, requireSandboxed } from "./environment.ts";
import { registerFileTools } from "./file_tools.ts";

export const SERVER_NAME = "sandbox";
/** Defaults and bounds of the tools' limits. */
export const LIMITS = {
  timeoutSeconds: 120,
  maxTimeoutSeconds: 86_400,
  outputBytes: 64 * 1024,
  maxOutputBytes: 1024 * 1024,
} as const;

/** What every tool's description says about the place the client works in. */
export const SANDBOX_NOTE =
  "Environments are sandboxes (hardened containers, bubblewrap namespaces or Kubernetes pods, as " +
  "the user's profile chooses), each with the repository checked out on a branch of its own. " +
  "Commands run there as an unprivileged user; nothing of the host is visible (no host files but, " +
  "in some modes, read-only system programs; localhost is the sandbox's own, not the host's). There is no " +
  "network except through an egress proxy (HTTP_PROXY/HTTPS_PROXY are set) that allows only the " +
  "hosts the user's profile lists; API keys never enter: an LLM proxy URL and a session token " +
  "stand in for them. Work comes back only through environment_finish, as a git branch in the " +
  "user's repository; the user's own working tree is never touched.";

export interface ServeMcpOptions {
  profile: Profile;
  /** A directory inside the git repository environments check out. */
  repoPath: string;
  /** The client's messages (the process's stdin). */
  input: Readable;
  /** Where replies go (the process's stdout: nothing else may write there). */
  output: Writable;
  /** Stops the server (SIGINT, SIGTERM): every environment is ended first. */
  signal?: AbortSignal;
  /** Slow steps and diagnostics, for stderr. */
  onProgress?: (line: string) => void;
}

/** The server's environments by id, and those still opening. */
export class Environments {
  readonly byId = new Map<string, Environment>();
  readonly opening = new Set<Promise<unknown>>();
  /** Aborted when the server stops: openings under way stop, and no new one starts. */
  readonly stopping = new AbortController();

  get(id: string): Environment {
    const environment = this.byId.get(id);
    if (!environment || environment.closed) {
      throw new SandboxError("usage", `No open environment "${id}"`, {
        detail: "Open one with environment_open; finish and discard end one",
      });
    }
    return environment;
  }

  /** End every environment (nothing brought back); waits for openings under way first. */
  async closeAll(reason: string): Promise<void> {
    this.stopping.abort(new SandboxError("interrupted", reason));
    await Promise.allSettled([...this.opening]);
    await Promise.all(
      [...this.byId.values()].map((environment) =>
        environment.close({ status: "interrupted", content: reason })
      ),
    );
    this.byId.clear();
  }
}

/** A tool's answer: text parts (JSON for structured answers), or a tool error. */
export interface ToolResult {
  content: { type: "text"; text: string }[];
  isError?: boolean;
}

/** What a tool's handler gets besides its input. */
export interface ToolExtra {
  /** Aborted when the client cancels the call. */
  signal: AbortSignal;
}

/**
 * Register a tool whose input is `inputSchema` (checked by the SDK before `handler` runs: wrong
 * types are a tool error the client sees). Typed here: the SDK's own types do not resolve under Deno.
 */
export function addTool<S extends z.ZodRawShape>(
  server: McpServer,
  name: string,
  config: { description: string; inputSchema: S },
  handler: (input: z.infer<z.ZodObject<S>>, extra: ToolExtra) => Promise<ToolResult>,
): void {
  server.registerTool(name, config, handler);
}

/** A tool's result: JSON text, or the error as a tool error the client can read and act on. */
export function jsonResult(value: unknown): ToolResult {
  return { content: [{ type: "text", text: JSON.stringify(value, null, 2) }] };
}

export function errorResult(error: unknown): ToolResult {
  const text = error instanceof SandboxError
    ? [error.message, error.detail].filter(Boolean).join("\n")
    : error instanceof Error
    ? error.message
    : String(error);
  return { content: [{ type: "text", text }], isError: true };
}

/**
 * Run one tool call on environment `id`: recorded in its run's events (`sandbox logs ID`), its
 * errors turned into tool errors.
 */
export async function onEnvironment(
  environments: Environments,
  call: { tool: string; id: string; input: Record<string, unknown> },
  work: (environment: Environment) => Promise<ToolResult>,
): Promise<ToolResult> {
  let environment: Environment;
  try {
    environment = environments.get(call.id);
  } catch (error) {
    return errorResult(error);
  }
  const callId = crypto.randomUUID();
  await environment.record(
    agenticMessage({
      type: "tool_call",
      tool_name: call.tool,
      tool_input: call.input,
      tool_call_id: callId,
    }),
  );
  const result = await work(environment).catch(errorResult);
  const text = result.content.map((part) => part.text).join("\n");
  await environment.record(
    agenticMessage({
      type: "tool_result",
      tool_name: call.tool,
      tool_output: text,
      tool_call_id: callId,
      is_error: result.isError === true,
    }),
  ).catch(() => {}); // an environment ended by this call has closed its record: nothing to add
  return result;
}

/** Serve until the client disconnects or `signal` aborts; every environment is gone on return. */
export async function serveMcp(options: ServeMcpOptions): Promise<void> {
  // A profile without a sandbox and a repository that is not one are the user's mistakes, said
  // before any client talks to us.
  requireSandboxed(options.profile);
  const repoPath = (await resolveLocalRepo(options.repoPath)).path;
  const environments = new Environments();
  const redactor = new Redactor();
  const keys = new KeyStore({ redactor });
  const server = new McpServer({ name: SERVER_NAME, version: "1" }, {
    instructions: SANDBOX_NOTE,
  });
  registerLifecycleTools(server, environments, {
    ...options,
    repoPath,
    keys,
    redactor,
  });
  registerFileTools(server, environments);
  const transport = new StdioServerTransport(options.input, options.output);
  let ended!: (reason: string) => void;
  const disconnected = new Promise<string>((resolve) => {
    ended = resolve;
    const gone = () => resolve("the MCP client disconnected");
    options.input.once("end", gone);
    options.input.once("close", gone);
    options.output.once("error", gone);
    if (options.signal?.aborted) resolve("the server was stopped");
    options.signal?.addEventListener("abort", () => resolve("the server was stopped"), {
      once: true,
    });
  });
  await server.connect(transport);
  // The connection closed from our side (a message that could not be read): that ends it too.
  server.server.onclose = () => ended("the MCP connection closed");
  const reason = await disconnected;
  options.onProgress?.(`${reason}: ending ${environments.byId.size} environment(s)`);
  await environments.closeAll(reason);
  await server.close().catch(() => {}); // the client is gone: nothing to tell it
}

/** Every tool but the file tools (file_tools.ts). */
function registerLifecycleTools(
  server: McpServer,
  environments: Environments,
  options: ServeMcpOptions & { keys: KeyStore; redactor: Redactor },
): void {
  addTool(server, "environment_open", {
    description: "Open a new environment: a fresh sandbox no one else has used, with the " +
      "repository's committed state (HEAD, or `base`) checked out on a new branch. Returns its " +
      "environment_id, the checkout's path in the sandbox and the branch the work becomes. " +
      "Uncommitted changes in the user's working tree are not included. Several environments " +
      "may be open at once; each is its own sandbox. " + SANDBOX_NOTE,
    inputSchema: {
      base: z.string().min(1).optional().describe("commit-ish to start from (default: HEAD)"),
      branch: z.string().min(1).optional().describe(
        "branch the work becomes in the user's repository (default: sandbox/<environment_id>); must not exist",
      ),
    },
  }, async (input) => {
    try {
      const opening = openEnvironment({
        profile: options.profile,
        repoPath: options.repoPath,
        base: input.base,
        branch: input.branch,
        keys: options.keys,
        redactor: options.redactor,
        signal: environments.stopping.signal,
        onProgress: options.onProgress,
      });
      environments.opening.add(opening);
      const environment = await opening.finally(() => environments.opening.delete(opening));
      if (environments.stopping.signal.aborted) {
        await environment.close({ status: "interrupted", content: "the server is stopping" });
        throw new SandboxError("interrupted", "The server is stopping");
      }
      environments.byId.set(environment.id, environment);
      return jsonResult({
        environment_id: environment.id,
        checkout: environment.checkout,
        branch: environment.worktree.targetBranch,
        sandbox_branch: environment.worktree.branch,
        base: environment.worktree.base,
        container: environment.sandbox.name,
      });
    } catch (error) {
      return errorResult(error);
    }
  });
  registerRunTool(server, environments);
  registerInspectTools(server, environments);
  registerEndTools(server, environments);
}

/** Tools taking only an environment id. */
const ID_ONLY = { environment_id: z.string().min(1).describe("from environment_open") };

/** environment_diff, environment_egress_log. */
function registerInspectTools(server: McpServer, environments: Environments): void {
  addTool(server, "environment_diff", {
    description: "The environment's changes against its base commit, new files included, as " +
      "`git diff` (with a --stat summary). Large diffs are cut at max_bytes.",
    inputSchema: {
      ...ID_ONLY,
      max_bytes: z.number().int().positive().max(LIMITS.maxOutputBytes).optional(),
    },
  }, (input, extra) =>
    onEnvironment(
      environments,
      { tool: "environment_diff", id: input.environment_id, input },
      async (env) => {
        const diff = await env.diff({
          maxBytes: input.max_bytes ?? LIMITS.outputBytes,
          signal: extra.signal,
        });
        return jsonResult({
          stat: diff.stat,
          diff: diff.patch.text,
          omitted_bytes: diff.patch.omittedBytes,
        });
      },
    ));
  addTool(server, "environment_egress_log", {
    description:
      "What the environment's sandbox tried to reach through the proxies (egress, LLM, " +
      "git): one entry per request or connection, allowed or denied, with the reason for a denial. " +
      "Use it to see why a download failed: only hosts the user's profile allows are reachable.",
    inputSchema: ID_ONLY,
  }, (input) =>
    onEnvironment(environments, {
      tool: "environment_egress_log",
      id: input.environment_id,
      input,
    }, (env) => Promise.resolve(jsonResult({ entries: env.egressLog() }))));
}

/** environment_finish, environment_discard. */
function registerEndTools(server: McpServer, environments: Environments): void {
  addTool(server, "environment_finish", {
    description: "Finish the environment: what is uncommitted in the checkout is committed (as " +
      "'sandbox'), the branch's commits are checked and brought into the user's repository as the " +
      "environment's branch (only that branch; the user's working tree is not touched), and the " +
      "sandbox is destroyed. If the work cannot be brought back, the environment stays open and the " +
      "error says why.",
    inputSchema: ID_ONLY,
  }, (input, extra) =>
    onEnvironment(
      environments,
      { tool: "environment_finish", id: input.environment_id, input },
      async (env) => {
        const back = await env.finish(extra.signal);
        environments.byId.delete(env.id);
        return jsonResult({
          branch: back.commit ? back.branch : null,
          repository: env.repo.path,
          base: back.base,
          commit: back.commit,
          commits: back.commits,
          diffstat: back.diffstat,
          committed_leftovers: back.committedLeftovers,
          ignored_refs: back.ignoredRefs,
        });
      },
    ));
  addTool(server, "environment_discard", {
    description: "Discard the environment: its sandbox is destroyed and nothing comes back.",
    inputSchema: ID_ONLY,
  }, (input) =>
    onEnvironment(
      environments,
      { tool: "environment_discard", id: input.environment_id, input },
      async (env) => {
        await env.close({
          status: "succeeded",
          content: "discarded",
          extra: { discarded: true, branch: null },
        });
        environments.byId.delete(env.id);
        return jsonResult({ discarded: env.id });
      },
    ));
}

function registerRunTool(server: McpServer, environments: Environments): void {
  addTool(server, "environment_run", {
    description: "Run a command in the environment: `command` as an argv array, or a string run " +
      "by `sh -c`; in `cwd` (relative to the checkout, default the checkout). Returns the exit " +
      "code, stdout and stderr (each cut at max_output_bytes). At timeout_seconds (default " +
      `${LIMITS.timeoutSeconds}) the command and everything it started are killed (exit code 124, ` +
      "timed_out true); nothing keeps running in the background between calls. stdin is empty. " +
      SANDBOX_NOTE,
    inputSchema: {
      environment_id: z.string().min(1).describe("from environment_open"),
      command: z.union([z.string().min(1), z.array(z.string()).min(1)]).describe(
        'a shell string ("npm test 2>&1 | tail") or an argv array (["git", "status"])',
      ),
      cwd: z.string().min(1).optional().describe("directory inside the checkout"),
      timeout_seconds: z.number().positive().max(LIMITS.maxTimeoutSeconds).optional(),
      max_output_bytes: z.number().int().positive().max(LIMITS.maxOutputBytes).optional(),
    },
  }, (input, extra) =>
    onEnvironment(
      environments,
      { tool: "environment_run", id: input.environment_id, input },
      async (env) => {
        const ran = await env.run(input.command, {
          cwd: input.cwd,
          timeoutMs: Math.ceil((input.timeout_seconds ?? LIMITS.timeoutSeconds) * 1000),
          maxOutputBytes: input.max_output_bytes ?? LIMITS.outputBytes,
          signal: extra.signal,
        });
        // A command that fails is a result (its exit code), not a tool error.
        return jsonResult({
          exit_code: ran.exitCode,
          timed_out: ran.timedOut,
          stdout: ran.stdout.text,
          stderr: ran.stderr.text,
          stdout_omitted_bytes: ran.stdout.omittedBytes,
          stderr_omitted_bytes: ran.stderr.omittedBytes,
          duration_ms: ran.durationMs,
        });
      },
    ));
}
