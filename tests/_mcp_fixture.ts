/**
 * `sandbox mcp` for tests: a throwaway profile (cold sandboxes, no pool), a temp git repository,
 * and the real CLI as the server — driven by the MCP SDK's own client over stdio, or spoken to
 * line by line on a raw pipe (to vanish mid-call as a crashed client does).
 */
export { git } from "./_git.ts";
import { git } from "./_git.ts";
import assert from "node:assert/strict";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { RunFixture } from "./_run_fixture.ts";
import { CLI, profileContainers } from "./_helpers.ts";
import { run } from "../lib/process.ts";

export const MCP_KEY_ENV = "SANDBOX_E2E_MCP_KEY";

/** `git ARGS` in `cwd`; stdout, trimmed, or a failure with stderr. */

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
  containers(): Promise<string[]> {
    return profileContainers(this.profile, { all: true });
  }

  /** Wait (polling, up to a minute: a release takes seconds) until `name` no longer exists. */
  async containerGone(name: string): Promise<boolean> {
    for (let i = 0; i < 600; i++) {
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

/**
 * The server on a raw pipe: JSON-RPC lines written by hand, so that the test can end the server's
 * input (a client that vanished) or signal it while a call is under way.
 */
export class RawMcpServer implements AsyncDisposable {
  readonly child: Deno.ChildProcess;
  readonly #writer: WritableStreamDefaultWriter<Uint8Array>;
  readonly #answers = new Map<number, (message: Json) => void>();
  readonly #reading: Promise<void>;
  #nextId = 1;

  constructor(fixture: McpFixture) {
    const [command, ...args] = fixture.serverArgv();
    const child = new Deno.Command(command, {
      args,
      env: fixture.serverEnv(),
      stdin: "piped",
      stdout: "piped",
      stderr: "inherit",
    }).spawn();
    this.child = child;
    this.#writer = child.stdin.getWriter();
    this.#reading = (async () => {
      let buffered = "";
      for await (const chunk of child.stdout.pipeThrough(new TextDecoderStream())) {
        buffered += chunk;
        let newline;
        while ((newline = buffered.indexOf("\n")) !== -1) {
          const message = JSON.parse(buffered.slice(0, newline)) as Json;
          buffered = buffered.slice(newline + 1);
          if (typeof message.id === "number") this.#answers.get(message.id)?.(message);
        }
      }
    })();
  }

  async #send(message: Json): Promise<void> {
    await this.#writer.write(new TextEncoder().encode(JSON.stringify(message) + "\n"));
  }

  /** Send a request; `answer` settles when its answer comes, if ever. */
  async request(method: string, params: Json): Promise<{ answer: Promise<Json> }> {
    const id = this.#nextId++;
    const answer = new Promise<Json>((resolve) => this.#answers.set(id, resolve));
    await this.#send({ jsonrpc: "2.0", id, method, params });
    return { answer };
  }

  async initialize(): Promise<void> {
    await (await this.request("initialize", {
      protocolVersion: "2025-06-18",
      capabilities: {},
      clientInfo: { name: "raw", version: "1" },
    })).answer;
    await this.#send({ jsonrpc: "2.0", method: "notifications/initialized" });
  }

  /** A tool call; its parsed JSON answer (the call's result must be one). */
  async tool(name: string, args: Json): Promise<Json> {
    const answer = await (await this.request("tools/call", { name, arguments: args })).answer;
    assert.ok(answer.result && !answer.result.isError, JSON.stringify(answer));
    return JSON.parse(answer.result.content[0].text);
  }

  /** The client vanishes: the server's input ends. */
  async closeInput(): Promise<void> {
    await this.#writer.close();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.#writer.close().catch(() => {}); // closed already by a test that vanished
    try {
      this.child.kill("SIGKILL");
    } catch {
      // Exited already: nothing to kill.
    }
    await this.child.status;
    await this.#reading.catch(() => {}); // the pipe ends with the process
  }
}
