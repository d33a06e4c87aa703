/**
 * `sandbox mcp` for tests: a throwaway profile (cold sandboxes, no pool), a temp git repository,
 * and the real CLI as the server — driven by the MCP SDK's own client over stdio, or spoken to
 * line by line on a raw pipe (to vanish mid-call as a crashed client does).
 */
import assert from "node:assert/strict";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { RunFixture } from "./_run_fixture.ts";
import { CLI } from "./_helpers.ts";
import { run } from "../lib/process.ts";

export const MCP_KEY_ENV = "SANDBOX_E2E_MCP_KEY";

/** `git ARGS` in `cwd`; stdout, trimmed, or a failure with stderr. */
export async function git(cwd: string, ...args: string[]): Promise<string> {
  const result = await run(["git", "-C", cwd, ...args]);
  assert.equal(result.exitCode, 0, `git ${args.join(" ")} failed in ${cwd}: ${result.stderr}`);
  return result.stdout.trim();
}

/** A fixture with a repository (`repo`: README.md committed on main). */
export class McpFixture extends RunFixture {
  repo = "";

  static async open(prefix: string): Promise<McpFixture> {
    const fixture = await McpFixture.make({
      prefix,
      // Never contacted: MCP environments run no agent of ours.
      llmUrl: "http://127.0.0.1:9/v1",
      keyEnv: MCP_KEY_ENV,
      prompt: "unused",
      sandboxYaml: "{pool: 0}",
    });
    const repo = `${fixture.dir.path}/repo`;
    await Deno.mkdir(repo);
    await git(repo, "init", "-q", "-b", "main");
    await Deno.writeTextFile(`${repo}/README.md`, "# demo\n");
    await git(repo, "add", "-A");
    await git(
      repo,
      "-c",
      "user.name=Owner",
      "-c",
      "user.email=owner@example.test",
      "commit",
      "-q",
      "-m",
      "initial",
    );
    fixture.repo = await Deno.realPath(repo);
    return fixture;
  }

  /** The server's argv: the real CLI. */
  serverArgv(): string[] {
    return [
      Deno.execPath(),
      "run",
      "-A",
      "--quiet",
      CLI,
      "--config",
      this.config,
      "mcp",
      "-p",
      this.profile,
      "--repo",
      this.repo,
    ];
  }

  serverEnv(): Record<string, string> {
    return { ...Deno.env.toObject(), ...this.env };
  }

  /** The SDK's client, connected to a new server. */
  async client(): Promise<McpClient> {
    const [command, ...args] = this.serverArgv();
    const transport = new StdioClientTransport({
      command,
      args,
      env: this.serverEnv(),
      stderr: "inherit",
    });
    const client = new Client({ name: "sandbox-tests", version: "1" });
    await client.connect(transport);
    return new McpClient(client);
  }

  /** The containers of this fixture's profile, by its label (only ours). */
  async containers(): Promise<string[]> {
    const listed = await run([
      "docker",
      "ps",
      "-a",
      "--filter",
      `label=dev.sandbox.profile=${this.profile}`,
      "--format",
      "{{.Names}}",
    ]);
    return listed.stdout.split("\n").filter(Boolean);
  }

  /** Wait (polling, up to two minutes) until `name` no longer exists. */
  async containerGone(name: string): Promise<boolean> {
    for (let i = 0; i < 1200; i++) {
      const found = await run(["docker", "container", "inspect", name]);
      if (found.exitCode !== 0) return true;
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    return false;
  }
}

// deno-lint-ignore no-explicit-any
export type Json = Record<string, any>;

/** A tool call's outcome: its text, parsed when JSON, and whether it was a tool error. */
export interface ToolAnswer {
  text: string;
  json: Json;
  isError: boolean;
}

export class McpClient implements AsyncDisposable {
  constructor(readonly client: Client) {}

  /** The server's tools (typed here: the SDK's own types do not resolve under Deno). */
  async tools(): Promise<{ name: string; description?: string; inputSchema: Json }[]> {
    return (await this.client.listTools()).tools;
  }

  async call(name: string, args: Record<string, unknown>): Promise<ToolAnswer> {
    const result = await this.client.callTool({ name, arguments: args }, undefined, {
      timeout: 600_000,
    });
    const content = result.content as { type: string; text: string }[];
    const text = content.map((part) => part.text).join("\n");
    let json: Json = {};
    try {
      json = JSON.parse(text);
    } catch {
      // Not JSON (read_file's raw text, an error's words): `text` has it.
    }
    return { text, json, isError: result.isError === true };
  }

  /** Call a tool that must succeed; its JSON answer. */
  async ok(name: string, args: Record<string, unknown>): Promise<Json> {
    const answer = await this.call(name, args);
    assert.ok(!answer.isError, `${name} failed: ${answer.text}`);
    return answer.json;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.client.close();
  }
}
