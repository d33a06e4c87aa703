/**
 * `sandbox mcp` with a profile in sandbox mode local (bubblewrap, no Docker): an environment is a
 * local sandbox acquired as a run's is, its work comes back as a branch on finish, and a client
 * that vanishes mid-command leaves no process and no directory of the sandbox behind.
 */
import assert from "node:assert/strict";
import { writeConfig } from "../_helpers.ts";
import { assertLocal, localTest } from "../_local.ts";
import { git, McpFixture, RawMcpServer } from "../_mcp_fixture.ts";

console.error("e2e: sandbox mcp mode local tests starting");

/** The fixture with its profile in mode local. */
async function localFixture(prefix: string): Promise<McpFixture> {
  const fixture = await McpFixture.open(prefix);
  fixture.config = await writeConfig(
    fixture.dir.path,
    `profiles:\n  ${fixture.profile}:\n` +
      `    llm: {provider: custom, base_url: "http://127.0.0.1:9/v1", key: {env: UNUSED}}\n` +
      "    sandbox: {mode: local}\n",
  );
  return fixture;
}

/** The local sandbox's directory (made at acquire, removed at release). */
function sandboxDir(fixture: McpFixture, name: string): string {
  return `${fixture.stateDir}/sandbox/local/${name}`;
}

async function exists(path: string): Promise<boolean> {
  return await Deno.lstat(path).then(() => true, () => false);
}

Deno.test({
  name:
    "in mode local, an MCP client opens an environment, works in it, and its branch comes back on finish",
  ...localTest(),
  async fn() {
    assertLocal();
    await using fixture = await localFixture("mcplocal");
    const head = await git(fixture.repo, "rev-parse", "HEAD");
    await using mcp = await fixture.client();
    const opened = await mcp.ok("environment_open", {});
    const id: string = opened.environment_id;
    assert.match(opened.container, /^local-/, "a local sandbox, not a container");
    assert.ok(await exists(sandboxDir(fixture, opened.container)), "the sandbox's directory");
    assert.equal(opened.base, head);

    const ran = await mcp.ok("environment_run", {
      environment_id: id,
      command: "pwd; cat README.md; id -u",
    });
    assert.equal(ran.exit_code, 0, JSON.stringify(ran));
    assert.equal(ran.stdout, `${opened.checkout}\n# demo\n10001\n`);
    await mcp.ok("environment_write_file", {
      environment_id: id,
      path: "notes/hello.txt",
      content: "written in the sandbox\n",
    });
    const read = await mcp.ok("environment_run", {
      environment_id: id,
      command: ["cat", "notes/hello.txt"],
    });
    assert.equal(read.stdout, "written in the sandbox\n");

    const back = await mcp.ok("environment_finish", { environment_id: id });
    assert.equal(back.branch, `sandbox/${id}`);
    assert.equal(
      await git(fixture.repo, "show", `${back.branch}:notes/hello.txt`),
      "written in the sandbox",
    );
    assert.equal(await git(fixture.repo, "rev-parse", `${back.branch}~1`), head);
    // The user's working tree and branch are as they were.
    assert.equal(await git(fixture.repo, "status", "--porcelain"), "");
    assert.equal(await git(fixture.repo, "rev-parse", "HEAD"), head);
    assert.equal(await exists(`${fixture.repo}/notes`), false);
    assert.equal(await exists(sandboxDir(fixture, opened.container)), false, "released");
    const meta = await fixture.meta(id);
    assert.equal(meta.status, "succeeded");
    assert.equal(meta.sandbox, "local");
  },
});

/** A host process: its pid and start time (a pid reused later is another process). */
interface HostProcess {
  pid: number;
  startTicks: string;
  cmdline: string;
}

/** Every host process: pid, parent, start time, command line (one that ended meanwhile is left out). */
async function hostProcesses(): Promise<(HostProcess & { ppid: number })[]> {
  const found: (HostProcess & { ppid: number })[] = [];
  for await (const entry of Deno.readDir("/proc")) {
    if (!/^\d+$/.test(entry.name)) continue;
    const stat = await Deno.readTextFile(`/proc/${entry.name}/stat`).catch(() => "");
    const cmdline = await Deno.readTextFile(`/proc/${entry.name}/cmdline`).catch(() => "");
    if (!stat) continue;
    // "pid (comm) state ppid … starttime(22nd)": comm may hold spaces and parentheses.
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    found.push({
      pid: Number(entry.name),
      ppid: Number(fields[1]),
      startTicks: fields[19],
      cmdline: cmdline.replaceAll("\0", " ").trim(),
    });
  }
  return found;
}

/** The processes under `root` (not itself), followed down through every parent on the host. */
async function descendants(root: number): Promise<HostProcess[]> {
  const all = await hostProcesses();
  const under = new Set([root]);
  for (let grew = true; grew;) {
    grew = false;
    for (const process of all) {
      if (!under.has(process.pid) && under.has(process.ppid)) {
        under.add(process.pid);
        grew = true;
      }
    }
  }
  return all.filter((process) => process.pid !== root && under.has(process.pid));
}

/** Those of `processes` still alive (same pid, same start time). */
async function alive(processes: HostProcess[]): Promise<HostProcess[]> {
  const now = await hostProcesses();
  return processes.filter((process) =>
    now.some((other) => other.pid === process.pid && other.startTicks === process.startTicks)
  );
}

Deno.test({
  name:
    "in mode local, the client vanishing mid-command releases the sandbox: none of its processes, nor its directory, is left",
  ...localTest(),
  async fn() {
    assertLocal();
    await using fixture = await localFixture("mcplocalgone");
    await using server = new RawMcpServer(fixture);
    await server.initialize();
    const opened = await server.tool("environment_open", {});
    const seconds = String(400_000 + Math.floor(Math.random() * 90_000));
    // Sent, never answered: the command does not end.
    await server.request("tools/call", {
      name: "environment_run",
      arguments: { environment_id: opened.environment_id, command: ["sleep", seconds] },
    });
    let started: HostProcess[] = [];
    for (let i = 0; i < 600; i++) {
      started = await descendants(server.child.pid);
      if (started.some((process) => process.cmdline === `sleep ${seconds}`)) break;
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    const listing = started.map((process) => process.cmdline).join("\n");
    assert.ok(started.some((p) => p.cmdline === `sleep ${seconds}`), `never started:\n${listing}`);
    assert.ok(started.some((p) => /bwrap --unshare-all/.test(p.cmdline)), `no holder:\n${listing}`);
    assert.ok(await exists(sandboxDir(fixture, opened.container)));

    await server.closeInput();
    const status = await server.child.status;
    assert.equal(status.code, 0, "the server ends as a server does");
    let left = await alive(started);
    for (let i = 0; i < 300 && left.length > 0; i++) {
      await new Promise((resolve) => setTimeout(resolve, 100));
      left = await alive(started);
    }
    assert.deepEqual(left.map((process) => process.cmdline), [], "processes of the sandbox remain");
    assert.equal(
      await exists(sandboxDir(fixture, opened.container)),
      false,
      "the sandbox was released (its directory removed), not merely left to die with the server",
    );
    const meta = await fixture.meta(opened.environment_id);
    assert.equal(meta.status, "interrupted");
  },
});
