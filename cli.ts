/**
 * The `sandbox` command line: parse arguments, call `lib/`, turn errors into exit codes.
 * This is the only module that exits the process.
 */
import { Command, CommanderError, Option } from "commander";
import YAML from "yaml";
import denoJson from "./deno.json" with { type: "json" };
import {
  type Config,
  findConfigFile,
  loadConfigOrThrow,
  parseConfig,
  profileNames,
  resolveProfile,
} from "./lib/config.ts";
import { DockerCli } from "./lib/docker.ts";
import { type DockerSandboxProvider, listSandboxes, statsAll, teardownAll } from "./lib/docker_provider.ts";
import { pruneFirewall } from "./lib/host_firewall.ts";
import { openSession, startHostProxies } from "./lib/session.ts";
import { runAgent } from "./lib/run.ts";
import { listRuns, readEventBatches, readRun } from "./lib/run_log.ts";
import { decodeMessage, encodeMessage } from "./lib/protocol.ts";
import { renderMessage } from "./lib/transcript.ts";
import { type JsonSchema, loadJsonSchema } from "./worker/json_schema.ts";
import { ConfigError, EXIT, exitCodeFor, SandboxError } from "./lib/errors.ts";
import { ensureImage } from "./lib/image.ts";
import { StdoutWriter, table } from "./lib/output.ts";
import { createProvider } from "./lib/providers.ts";
import { formatAge, formatBytes, parseDuration } from "./lib/units.ts";

const VERSION = denoJson.version;
/** Buffered: events join the write in flight instead of one awaited write each; flushed in main. */
const stdout = new StdoutWriter(Deno.stdout, { buffered: true });
const encoder = new TextEncoder();

/** Diagnostics and progress: stderr only, never stdout. */
function note(message: string): void {
  Deno.stderr.writeSync(encoder.encode(`sandbox: ${message}\n`));
}

/** Cancelled by Ctrl-C or SIGTERM; a second signal exits at once. */
const interrupt = new AbortController();
function onSignal(): void {
  if (interrupt.signal.aborted) Deno.exit(EXIT.interrupted);
  interrupt.abort(new SandboxError("interrupted", "Interrupted"));
}
Deno.addSignalListener("SIGINT", onSignal);
Deno.addSignalListener("SIGTERM", onSignal);
const signal = interrupt.signal;

interface GlobalOptions {
  config?: string;
}

function globals(command: Command): GlobalOptions {
  return command.optsWithGlobals() as GlobalOptions;
}

async function profileFor(command: Command, name?: string) {
  const { config } = await loadConfigOrThrow({ explicit: globals(command).config });
  return resolveProfile(config, name);
}

function collect(value: string, previous: string[] = []): string[] {
  return [...previous, value];
}

function parseEnvPairs(pairs: string[]): Record<string, string> {
  const env: Record<string, string> = {};
  for (const pair of pairs) {
    const eq = pair.indexOf("=");
    if (eq <= 0) throw new SandboxError("usage", `Invalid --env "${pair}": expected KEY=VALUE`);
    env[pair.slice(0, eq)] = pair.slice(eq + 1);
  }
  return env;
}

function parseTimeout(text: string | undefined): number | undefined {
  if (text === undefined) return undefined;
  const ms = parseDuration(text);
  if (!ms) throw new SandboxError("usage", `Invalid --timeout "${text}": expected a duration like "30m", "90s" or "1h"`);
  return ms;
}

const jsonOption = () => new Option("--json", "machine-readable output on stdout");
const profileOption = () => new Option("-p, --profile <name>", "profile to use (default: $SANDBOX_PROFILE, default_profile, or \"default\")");

function buildProgram(): Command {
  const program = new Command("sandbox")
    .description("Run AI coding agents in isolated Docker sandboxes")
    .version(VERSION, "-V, --version")
    .option("-c, --config <file>", "configuration file (default: ./sandbox.yaml, the repo root's, or ~/.config/sandbox/config.yaml)")
    .enablePositionalOptions()
    .showHelpAfterError("(run with --help for usage)")
    .exitOverride()
    .configureOutput({ writeErr: (text) => Deno.stderr.writeSync(encoder.encode(text)) });

  program.command("up")
    .description("start the profile's sandbox container if it is not running (idempotent)")
    .addOption(profileOption()).addOption(jsonOption())
    .action(async (opts: { profile?: string; json?: boolean }, command: Command) => {
      const profile = await profileFor(command, opts.profile);
      const provider = createProvider(profile, { onProgress: note });
      const status = await provider.ensureRunning({ signal, checkImage: true });
      if (opts.json) await stdout.json(status);
      else note(`sandbox ${status.name} is ${status.state} (profile ${profile.name}, image ${status.image})`);
    });

  program.command("down")
    .description("stop and remove the profile's sandbox container")
    .addOption(profileOption()).addOption(jsonOption())
    .option("--volumes", "also remove its workspace volume (the sandbox's copy of your repos)")
    .action(async (opts: { profile?: string; json?: boolean; volumes?: boolean }, command: Command) => {
      const profile = await profileFor(command, opts.profile);
      const report = await createProvider(profile).teardown({ volumes: opts.volumes, signal });
      if (opts.json) await stdout.json(report);
      else if (report.containers.length === 0) note(`no sandbox running for profile ${profile.name}`);
      else note(`removed ${[...report.containers, ...report.volumes].join(", ")}`);
    });

  const listAction = async (opts: { json?: boolean }) => {
    const sandboxes = await listSandboxes(new DockerCli(), signal);
    if (opts.json) return void await stdout.json(sandboxes);
    if (sandboxes.length === 0) return note("no sandboxes (start one with: sandbox up)");
    await stdout.line(table(
      ["PROFILE", "CONTAINER", "IMAGE", "STATE", "HEALTH", "AGE"],
      sandboxes.map((s) => [s.profile, s.name, s.image, s.state, s.health, formatAge(Date.now() - Date.parse(s.createdAt))]),
    ));
  };
  program.command("status").description("list every sandbox this tool owns").addOption(jsonOption()).action(listAction);
  program.command("ls").description("same as status").addOption(jsonOption()).action(listAction);

  program.command("exec")
    .description("run a command inside the sandbox, streaming its output; exits with its exit code")
    .addOption(profileOption())
    .option("--cwd <dir>", "working directory inside the sandbox", "/workspace")
    .option("-e, --env <KEY=VALUE>", "set a variable for this command (repeatable)", collect, [])
    .option("--timeout <duration>", "kill the command after this long (default: the profile's resources.timeout)")
    .argument("<command...>", "the command and its arguments (after --)")
    .passThroughOptions()
    .action(async (argv: string[], opts: { profile?: string; cwd: string; env: string[]; timeout?: string }, command: Command) => {
      const env = parseEnvPairs(opts.env);
      const timeoutMs = parseTimeout(opts.timeout);
      const profile = await profileFor(command, opts.profile);
      const provider = createProvider(profile, { onProgress: note }) as DockerSandboxProvider;
      await provider.ensureRunning({ signal });
      // While the command runs, this process serves its proxies (LLM credentials, egress).
      await using session = await openSession(profile, provider, { signal });
      const stream = provider.execStream(argv, {
        cwd: opts.cwd,
        env: { ...session.env, ...env },
        stdin: Deno.stdin.isTerminal() ? undefined : Deno.stdin.readable,
        signal,
        timeoutMs: timeoutMs ?? profile.resources.timeoutMs,
        onStderrLine: (line) => Deno.stderr.writeSync(encoder.encode(line + "\n")),
      });
      for await (const line of stream) {
        await stdout.line(line);
        if (stdout.closed) break;
      }
      const outcome = await stream.outcome;
      if (outcome.oomKilled) {
        note(`the command was killed by the sandbox memory limit (${formatBytes(profile.resources.memoryBytes)}); raise resources.memory in profile ${profile.name}`);
      }
      exitCode = outcome.exitCode;
    });

  program.command("stats")
    .description("memory, CPU and processes of each running sandbox")
    .addOption(jsonOption())
    .action(async (opts: { json?: boolean }) => {
      const stats = await statsAll(new DockerCli(), signal);
      if (opts.json) return void await stdout.json(stats);
      if (stats.length === 0) return note("no running sandboxes");
      await stdout.line(table(
        ["PROFILE", "CONTAINER", "MEMORY", "LIMIT", "CPU", "PIDS"],
        stats.map((s) => [s.profile, s.name, formatBytes(s.memoryBytes), formatBytes(s.memoryLimitBytes), `${s.cpuPercent.toFixed(1)}%`, `${s.pids}/${s.pidsLimit}`]),
      ));
    });

  program.command("teardown")
    .description("remove every container, network and volume this tool created (by label), and nothing else")
    .requiredOption("--all", "confirm: remove all of them, including orphans of crashed runs")
    .addOption(jsonOption())
    .action(async (opts: { json?: boolean }) => {
      const report = await teardownAll(new DockerCli(), signal);
      await pruneFirewall();
      if (opts.json) return void await stdout.json(report);
      const total = report.containers.length + report.networks.length + report.volumes.length;
      if (total === 0) return note("nothing to remove");
      for (const [kind, names] of Object.entries(report)) {
        if ((names as string[]).length > 0) note(`removed ${kind}: ${(names as string[]).join(", ")}`);
      }
    });

  program.command("proxy")
    .description("serve the credential and egress proxies standalone, for orchestrators that run their own containers")
    .addOption(profileOption()).addOption(jsonOption())
    .option("--listen <addr>", "address to listen on (repeatable; never all interfaces)", collect, [])
    .action(async (opts: { profile?: string; json?: boolean; listen: string[] }, command: Command) => {
      const profile = await profileFor(command, opts.profile);
      const hostnames = opts.listen.length > 0 ? opts.listen : ["127.0.0.1"];
      await using proxies = await startHostProxies(profile, hostnames, { signal }).catch((error) => {
        throw error instanceof TypeError ? new SandboxError("usage", `Invalid --listen: ${error.message}`) : error;
      });
      const info = {
        profile: profile.name,
        llm_base_url: hostnames.map((h) => proxies.llmUrl(h)),
        egress_proxy_url: hostnames.map((h) => proxies.egressUrl(h)).filter(Boolean),
        token: proxies.token,
        model: proxies.model,
        authentication: "send the token as \"Authorization: Bearer TOKEN\" or \"x-api-key: TOKEN\"; it dies with this process",
        env: proxies.envFor(hostnames[0]),
      };
      if (opts.json) await stdout.json(info);
      else {
        note(`credential proxy: ${info.llm_base_url.join(", ")} (OpenAI-style; Anthropic clients use it without /v1)`);
        if (info.egress_proxy_url.length) note(`egress proxy: ${info.egress_proxy_url.join(", ")} (set HTTP_PROXY/HTTPS_PROXY)`);
        note(`token: ${info.token}`);
        note(`sandboxes authenticate with the token as their API key; Ctrl-C stops the proxies`);
      }
      // A signal may already have arrived while the proxies started: check before waiting.
      if (!signal.aborted) await new Promise((resolve) => signal.addEventListener("abort", resolve, { once: true }));
      proxyStopped = true;
    });

  const runCommand = program.command("run").description("run an agent in the sandbox, streaming its messages");
  for (const mode of ["agentic", "generate"] as const) {
    const sub = runCommand.command(mode)
      .description(mode === "agentic"
        ? "run a tool-using coding agent; one AgenticMessage JSON per line on stdout"
        : "one structured-output LLM call; with --schema the result is JSON valid against it")
      .requiredOption("--prompt-file <file>", "the prompt (\"-\" reads stdin)")
      .addOption(profileOption())
      .option("-m, --model <model>", "model name, or replay:FILE to serve a recorded conversation (no key needed)")
      .option("--timeout <duration>", "stop the run after this long (default: the profile's resources.timeout)")
      .option("--record <file>", "record the provider's responses to FILE, for replay later")
      .addOption(new Option("--format <format>", "output format (default: pretty on a terminal, else ndjson)").choices(["ndjson", "pretty"]));
    if (mode === "agentic") {
      sub.option("--instructions-file <file>", "extra system instructions for the agent")
        .option("--cwd <dir>", "mode none only: the host directory the agent works in (default: current)")
        .option("--repo <path>", "a local git repository: its committed base goes in, the agent's work comes back as a branch")
        .option("--base <ref>", "with --repo: the commit to start from (default: HEAD)")
        .option("--branch <name>", "with --repo: the branch to create (default: sandbox/<run-id>)")
        .option("--keep-worktree", "with --repo: leave the run's worktree in the sandbox")
        .option("--push", "with a remote --repo: push the run branch (the only ref the git proxy lets through)")
        .option("--lifecycle-events", "also print our own namespaced events (sandbox.branch) on stdout");
    } else {
      sub.option("--schema <file>", "JSON Schema the result must satisfy");
    }
    sub.action(async (opts: RunFlags, command: Command) => {
      exitCode = await runAction(mode, opts, command);
    });
  }

  program.command("runs")
    .description("past and live runs: id, profile, status, started, duration, tokens, exit, branch")
    .addOption(jsonOption())
    .action(async (opts: { json?: boolean }) => {
      const runs = await listRuns();
      if (opts.json) return void await stdout.json(runs);
      if (runs.length === 0) return note("no runs yet (start one with: sandbox run agentic --prompt-file FILE)");
      await stdout.line(table(
        ["RUN", "PROFILE", "MODE", "STATUS", "STARTED", "DURATION", "TOKENS", "EXIT", "BRANCH"],
        runs.map((r) => [
          r.id,
          r.profile,
          r.mode,
          r.status,
          r.startedAt.replace("T", " ").slice(0, 19),
          r.durationMs === null ? "-" : `${(r.durationMs / 1000).toFixed(1)}s`,
          r.usage ? `${r.usage.input_tokens ?? 0}/${r.usage.output_tokens ?? 0}` : "-",
          r.exitCode === null ? "-" : String(r.exitCode),
          typeof r.extra?.branch === "string" ? r.extra.branch : "-",
        ]),
      ));
    });

  program.command("logs")
    .description("replay a run's events; --follow tails a live run")
    .argument("<run-id>", "as listed by sandbox runs")
    .option("-f, --follow", "keep reading until the run ends")
    .addOption(new Option("--format <format>", "output format (default: pretty on a terminal, else ndjson)").choices(["ndjson", "pretty"]))
    .action(async (id: string, opts: { follow?: boolean; format?: string }) => {
      if (!await readRun(id)) throw new SandboxError("usage", `No run "${id}"`, { detail: "List runs with: sandbox runs" });
      const pretty = (opts.format ?? (Deno.stdout.isTerminal() ? "pretty" : "ndjson")) === "pretty";
      for await (const lines of readEventBatches(id, { follow: opts.follow, signal })) {
        const text = pretty ? lines.map((line) => renderMessage(decodeMessage(line))) : lines;
        await stdout.write(text.join("\n") + "\n");
        if (stdout.closed) break;
      }
      if (signal.aborted) proxyStopped = true;
    });

  const image = program.command("image").description("manage the sandbox image");
  image.command("build")
    .description("build (or rebuild) the sandbox image for a profile")
    .addOption(profileOption()).addOption(jsonOption())
    .action(async (opts: { profile?: string; json?: boolean }, command: Command) => {
      const profile = await profileFor(command, opts.profile);
      const info = await ensureImage(new DockerCli(), profile.sandbox.image, { force: true, onProgress: note, signal });
      if (opts.json) await stdout.json(info);
      else note(`built ${info.tag} (on ${profile.sandbox.image})`);
    });

  const config = program.command("config").description("check and print the configuration");
  config.command("validate")
    .description("check a configuration file (default: the one sandbox would use)")
    .argument("[file]", "file to check")
    .addOption(jsonOption())
    .action(async (file: string | undefined, opts: { json?: boolean }, command: Command) => {
      const path = file ?? await findConfigFile({ explicit: globals(command).config });
      if (path === undefined) {
        if (opts.json) await stdout.json({ valid: true, file: null, profiles: ["default"] });
        else note("no configuration file found; the built-in default profile applies");
        return;
      }
      const { config } = await loadConfigOrThrow({ explicit: path });
      if (opts.json) await stdout.json({ valid: true, file: path, profiles: profileNames(config) });
      else note(`${path} is valid (profiles: ${profileNames(config).join(", ")})`);
    });
  config.command("show")
    .description("print the effective configuration, defaults filled in")
    .addOption(jsonOption())
    .action(async (opts: { json?: boolean }, command: Command) => {
      const { config, file } = await loadConfigOrThrow({ explicit: globals(command).config });
      const effective = effectiveConfig(config);
      if (opts.json) await stdout.json({ file: file ?? null, ...effective });
      else await stdout.write(`# ${file ?? "built-in defaults (no configuration file found)"}\n${YAML.stringify(effective)}`);
    });

  return program;
}

interface RunFlags {
  promptFile: string;
  profile?: string;
  model?: string;
  timeout?: string;
  record?: string;
  format?: "ndjson" | "pretty";
  instructionsFile?: string;
  cwd?: string;
  schema?: string;
  repo?: string;
  base?: string;
  branch?: string;
  keepWorktree?: boolean;
  push?: boolean;
  lifecycleEvents?: boolean;
}

async function readInput(path: string, what: string): Promise<string> {
  try {
    return path === "-" ? await new Response(Deno.stdin.readable).text() : await Deno.readTextFile(path);
  } catch (error) {
    throw new SandboxError("usage", `Cannot read ${what} "${path}": ${(error as Error).message}`);
  }
}

async function runAction(mode: "agentic" | "generate", opts: RunFlags, command: Command): Promise<number> {
  const timeoutMs = parseTimeout(opts.timeout);
  if (!opts.repo && (opts.base || opts.branch || opts.keepWorktree || opts.push)) {
    throw new SandboxError("usage", "--base, --branch, --keep-worktree and --push need --repo");
  }
  const profile = await profileFor(command, opts.profile);
  const prompt = await readInput(opts.promptFile, "prompt file");
  const instructions = opts.instructionsFile ? await readInput(opts.instructionsFile, "instructions file") : undefined;
  let schema: JsonSchema | undefined;
  if (opts.schema) {
    try {
      schema = await loadJsonSchema(opts.schema);
    } catch (error) {
      throw new SandboxError("usage", (error as Error).message);
    }
  }
  const pretty = (opts.format ?? (Deno.stdout.isTerminal() ? "pretty" : "ndjson")) === "pretty";
  const outcome = await runAgent({
    mode,
    prompt,
    profile,
    model: opts.model,
    instructions,
    schema,
    timeoutMs: timeoutMs ?? profile.resources.timeoutMs,
    record: opts.record,
    hostCwd: opts.cwd,
    repo: opts.repo
      ? { path: opts.repo, base: opts.base, branch: opts.branch, keepWorktree: opts.keepWorktree, push: opts.push }
      : undefined,
    onLifecycle: opts.lifecycleEvents ? (event) => stdout.json(event) : undefined,
    signal,
    onStart: (meta) => note(`run ${meta.id} (profile ${meta.profile}, model ${meta.model}); replay with: sandbox logs ${meta.id}`),
    onProgress: note,
    onWorkerStderr: (line) => {
      if (Deno.env.get("SANDBOX_DEBUG")) note(`worker: ${line}`);
    },
    onEvent: async (message) => {
      await stdout.line(pretty ? renderMessage(message) : encodeMessage(message));
    },
  });
  if (outcome.error) reportError(outcome.error);
  return outcome.exitCode;
}

/** The configuration with every profile's defaults filled in, including the implicit one. */
function effectiveConfig(config: Config): Config {
  const defaults = parseConfig("profiles: {default: {}}");
  if (defaults.kind !== "ok") throw new Error("unreachable: built-in defaults are invalid");
  const profiles = { ...defaults.config.profiles, ...config.profiles };
  for (const name of Object.keys(profiles)) {
    const cpus = resolveProfile({ ...config, profiles }, name).resources.cpus;
    profiles[name] = { ...profiles[name], sandbox: { ...profiles[name].sandbox, resources: { ...profiles[name].sandbox.resources, cpus } } };
  }
  return { ...config, profiles };
}

function reportError(error: unknown): void {
  if (error instanceof SandboxError) {
    note(`error: ${error.message}`);
    if (error.detail) for (const line of error.detail.split("\n")) note(`  ${line}`);
    if (error instanceof ConfigError) note("  (see README.md, Configuration)");
    if (Deno.env.get("SANDBOX_DEBUG")) console.error(error);
    return;
  }
  // Not one of ours: a bug, so the stack is worth showing.
  note(`internal error: ${error instanceof Error ? error.stack ?? error.message : String(error)}`);
}

let exitCode: number = EXIT.ok;
/** `sandbox proxy` ends on a signal by design: that is success, not an interruption. */
let proxyStopped = false;

export async function main(args: string[]): Promise<number> {
  const program = buildProgram();
  try {
    await program.parseAsync(args, { from: "user" });
    await stdout.flush();
    return proxyStopped ? EXIT.ok : signal.aborted ? EXIT.interrupted : exitCode;
  } catch (error) {
    await stdout.flush().catch(() => {});
    if (error instanceof CommanderError) {
      // Help and version are successes; anything else commander rejects is a usage error.
      return error.exitCode === 0 ? EXIT.ok : EXIT.usage;
    }
    if (signal.aborted && !(error instanceof SandboxError && error.code !== "interrupted")) {
      note("interrupted");
      return EXIT.interrupted;
    }
    reportError(error);
    return exitCodeFor(error);
  }
}

if (import.meta.main) {
  Deno.exit(await main(Deno.args));
}
