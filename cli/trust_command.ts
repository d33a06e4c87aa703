/**
 * `sandbox trust [FILE]`, `--list`, `--revoke`: the user's consent, by content hash, to a project's
 * configuration file (direnv `allow`, mise `trust`). Until then sandbox ignores the file.
 */
import type { Command } from "commander";
import {
  CONFIG_FILE_NAMES,
  findProjectConfigFile,
  notUtf8,
  readConfigBytes,
  validateConfigText,
} from "../lib/config.ts";
import { decodeUtf8 } from "../lib/input_file.ts";
import { shellQuote, summarizeConfig } from "../lib/config_summary.ts";
import { loadYaml } from "../lib/yaml.ts";
import { ConfigError, SandboxError } from "../lib/errors.ts";
import { table } from "../lib/output.ts";
import { listTrust, revokeTrust, trustContent, trustKey } from "../lib/trust.ts";
import { agentConfigUnit, summarizeAgentFile } from "../lib/agents/project_config.ts";
import { note, stdout } from "./context.ts";
import { jsonOption } from "./options.ts";

interface TrustFlags {
  list?: boolean;
  revoke?: boolean;
  json?: boolean;
}

export function registerTrustCommand(program: Command): void {
  program.command("trust")
    .description(
      "trust a project's sandbox.yaml, or its agent configuration (.claude/, .mcp.json, .codex/), in this exact content; until then sandbox ignores it",
    )
    .argument(
      "[file]",
      "the file or agent configuration directory (default: the project file sandbox would find here)",
    )
    .option("--list", "list trusted files and whether they changed since")
    .option("--revoke", "forget the trust in FILE")
    .addOption(jsonOption())
    .action(async (file: string | undefined, opts: TrustFlags) => {
      if (opts.list && (opts.revoke || file !== undefined)) {
        throw new SandboxError("usage", "--list takes neither a file nor --revoke");
      }
      if (opts.list) return await list(opts.json);
      const target = file ?? await projectFile();
      if (opts.revoke) return await revoke(target, opts.json);
      await trust(target, opts.json);
    });
}

async function projectFile(): Promise<string> {
  const found = await findProjectConfigFile();
  if (found === undefined) {
    throw new SandboxError("usage", "No project configuration file to trust", {
      detail: `Looked for ${
        CONFIG_FILE_NAMES.join(", ")
      } in ${Deno.cwd()} and its repository root; name one: sandbox trust FILE`,
    });
  }
  return found;
}

/** Validate, then trust: the bytes validated are the bytes whose hash is stored. */
async function trust(file: string, json?: boolean): Promise<void> {
  const agentFiles = await agentConfigFiles(file);
  if (agentFiles) return await trustAgentConfig(agentFiles, json);
  const read = await readConfigBytes(file);
  if (read.kind === "unreadable") {
    throw new SandboxError("usage", `Cannot trust ${shellQuote(file)}: ${read.reason}`);
  }
  const { bytes } = read;
  const decoded = decodeUtf8(bytes);
  const text = decoded.kind === "ok" ? decoded.text : "";
  await loadYaml();
  const checked = decoded.kind === "ok"
    ? validateConfigText(text, file, "project")
    : { kind: "invalid" as const, issues: [notUtf8(decoded.offset)] };
  if (checked.kind === "invalid") {
    note("not trusted: a project file must be valid, and may not use a key command");
    throw new ConfigError(file, checked.issues);
  }
  const entry = await trustContent(file, bytes);
  const summary = summarizeConfig(text);
  if (json) return void await stdout.json({ ...entry, summary });
  await stdout.line(
    `trusted ${shellQuote(entry.file)} (sha256 ${entry.sha256.slice(0, 12)}); it sets:`,
  );
  for (const line of summary) await stdout.line(`  ${line}`);
  await stdout.line("any change to it must be trusted again");
}

/**
 * An agent CLI's configuration in a repository (`.claude/`, `.mcp.json`, `.codex/`, or a file under
 * them): its regular files, each trusted by its own content. `undefined`: not agent configuration.
 */
async function agentConfigFiles(
  target: string,
): Promise<{ files: string[]; skipped: string[] } | undefined> {
  const unit = await agentConfigUnit(target);
  if (!unit) return undefined;
  const files: string[] = [];
  const skipped: string[] = [];
  const walk = async (path: string) => {
    const info = await Deno.lstat(path);
    if (info.isFile) files.push(path);
    else if (info.isDirectory) {
      const names = [];
      for await (const entry of Deno.readDir(path)) names.push(entry.name);
      for (const name of names.sort()) await walk(`${path}/${name}`);
    } else skipped.push(path);
  };
  await walk(unit);
  return { files, skipped };
}

async function trustAgentConfig(
  found: { files: string[]; skipped: string[] },
  json?: boolean,
): Promise<void> {
  const trusted = [];
  for (const file of found.files) {
    const bytes = await Deno.readFile(file);
    trusted.push({ ...await trustContent(file, bytes), summary: summarizeAgentFile(file, bytes) });
  }
  for (const path of found.skipped) {
    note(`not trusted: ${shellQuote(path)} is not a regular file (the agent never reads it)`);
  }
  if (json) return void await stdout.json(trusted);
  for (const entry of trusted) {
    await stdout.line(
      `trusted ${shellQuote(entry.file)} (sha256 ${entry.sha256.slice(0, 12)}); it sets:`,
    );
    for (const line of entry.summary) await stdout.line(`  ${line}`);
  }
  await stdout.line(
    "the agent reads it as its project configuration; any change to it must be trusted again",
  );
}

async function revoke(file: string, json?: boolean): Promise<void> {
  const agentFiles = await agentConfigFiles(file);
  if (agentFiles && agentFiles.files.length !== 1) {
    const revoked = [];
    for (const each of agentFiles.files) {
      revoked.push({ file: await trustKey(each), revoked: await revokeTrust(each) });
    }
    if (json) return void await stdout.json(revoked);
    for (const entry of revoked.filter((e) => e.revoked)) {
      await stdout.line(`revoked the trust in ${shellQuote(entry.file)}`);
    }
    if (!revoked.some((e) => e.revoked)) note(`nothing under ${shellQuote(file)} was trusted`);
    return;
  }
  const revoked = await revokeTrust(file);
  const key = await trustKey(file);
  if (json) return void await stdout.json({ file: key, revoked });
  if (revoked) await stdout.line(`revoked the trust in ${shellQuote(key)}`);
  else note(`${shellQuote(key)} was not trusted`);
}

async function list(json?: boolean): Promise<void> {
  const entries = await listTrust();
  if (json) return void await stdout.json(entries);
  if (entries.length === 0) return note("no trusted files (trust one with: sandbox trust FILE)");
  await stdout.line(table(
    ["FILE", "STATE", "TRUSTED", "SHA256"],
    entries.map((
      e,
    ) => [
      shellQuote(e.file),
      e.state,
      e.trusted_at.replace("T", " ").slice(0, 19),
      e.sha256.slice(0, 12),
    ]),
  ));
}
