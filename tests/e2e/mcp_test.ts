/**
 * `sandbox mcp` with the MCP SDK's own client over stdio against the real CLI and a real sandbox:
 * an environment opened on a temp repository, commands and files in it, the diff, and the branch
 * that comes back to the host repository on finish — with the user's working tree untouched, and
 * the environment recorded as a run (`sandbox runs`, `sandbox logs`).
 */
import assert from "node:assert/strict";
import { assertDocker, dockerTest, explain, spawnCli, writeConfig } from "../_helpers.ts";
import { git, McpFixture } from "../_mcp_fixture.ts";

console.error("e2e: sandbox mcp tests starting");

const TOOLS = [
  "environment_open",
  "environment_run",
  "environment_read_file",
  "environment_write_file",
  "environment_list_files",
  "environment_search",
  "environment_diff",
  "environment_egress_log",
  "environment_finish",
  "environment_discard",
];

Deno.test({
  name: "an MCP client opens an environment, works in it, and its branch comes back on finish",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using fixture = await McpFixture.open("mcp");
    await using mcp = await fixture.client();
    const tools = await mcp.tools();
    assert.deepEqual(tools.map((tool) => tool.name).sort(), [...TOOLS].sort());
    for (const tool of tools) assert.ok((tool.description ?? "").length > 40, tool.name);
    assert.match(
      tools.find((tool) => tool.name === "environment_run")!.description!,
      /no network except/,
    );

    const opened = await mcp.ok("environment_open", {});
    const id: string = opened.environment_id;
    assert.equal(opened.branch, `sandbox/${id}`);
    assert.equal(opened.base, await git(fixture.repo, "rev-parse", "HEAD"));

    const ran = await mcp.ok("environment_run", { environment_id: id, command: ["pwd"] });
    assert.equal(ran.exit_code, 0, JSON.stringify(ran));
    assert.equal(ran.stdout.trim(), opened.checkout);
    const shell = await mcp.ok("environment_run", {
      environment_id: id,
      command: "cat README.md; echo to-stderr >&2; exit 3",
    });
    assert.equal(shell.exit_code, 3);
    assert.equal(shell.stdout, "# demo\n");
    assert.equal(shell.stderr, "to-stderr\n");

    await mcp.ok("environment_write_file", {
      environment_id: id,
      path: "src/greet.sh",
      content: "echo hello\n",
    });
    assert.equal(
      (await mcp.call("environment_read_file", { environment_id: id, path: "src/greet.sh" }))
        .text,
      "echo hello\n",
    );
    const committed = await mcp.ok("environment_run", {
      environment_id: id,
      command: "git add src/greet.sh && git commit -q -m 'Add greet' && git log -1 --format=%an",
    });
    assert.equal(committed.stdout.trim(), "sandbox agent", JSON.stringify(committed));
    // Left uncommitted: finish commits it.
    await mcp.ok("environment_write_file", {
      environment_id: id,
      path: "notes.txt",
      content: "left over\n",
    });
    const listed = await mcp.ok("environment_list_files", { environment_id: id });
    assert.deepEqual(
      listed.entries.map((e: { path: string }) => e.path),
      ["README.md", "notes.txt", "src", "src/greet.sh"],
    );
    const found = await mcp.ok("environment_search", { environment_id: id, pattern: "hel+o" });
    assert.deepEqual(found.matches, ["src/greet.sh:1:echo hello"]);
    const diff = await mcp.ok("environment_diff", { environment_id: id });
    assert.match(diff.diff, /\+\+\+ b\/notes\.txt/);
    assert.match(diff.diff, /\+\+\+ b\/src\/greet\.sh/);

    const back = await mcp.ok("environment_finish", { environment_id: id });
    assert.equal(back.branch, `sandbox/${id}`);
    assert.equal(back.committed_leftovers, true);
    assert.equal(await git(fixture.repo, "rev-parse", `sandbox/${id}`), back.commit);
    assert.equal(await git(fixture.repo, "show", `sandbox/${id}:src/greet.sh`), "echo hello");
    assert.equal(await git(fixture.repo, "show", `sandbox/${id}:notes.txt`), "left over");
    assert.deepEqual(
      (await git(fixture.repo, "log", "--format=%s", `main..sandbox/${id}`)).split("\n"),
      [`Uncommitted changes left by sandbox run ${id}`, "Add greet"],
    );
    // The user's working tree, index and branch: as they were.
    assert.equal(await git(fixture.repo, "status", "--porcelain"), "");
    assert.equal(await git(fixture.repo, "branch", "--show-current"), "main");
    await assert.rejects(Deno.stat(`${fixture.repo}/src`), Deno.errors.NotFound);
    // The environment is over: its sandbox is gone, and a call on it is a tool error.
    assert.ok(await fixture.containerGone(opened.container), `${opened.container} still exists`);
    const after = await mcp.call("environment_run", { environment_id: id, command: "true" });
    assert.ok(after.isError);
    assert.match(after.text, /No open environment/);

    // Recorded as a run.
    const runs = await fixture.cli(["runs", "--json"]);
    assert.equal(runs.exitCode, 0, explain(runs));
    const meta = JSON.parse(runs.stdout).find((r: { id: string }) => r.id === id);
    assert.equal(meta?.mode, "mcp", runs.stdout);
    assert.equal(meta.status, "succeeded");
    assert.equal(meta.extra.branch, `sandbox/${id}`);
    const logs = await fixture.cli(["logs", id, "--format", "ndjson"]);
    assert.equal(logs.exitCode, 0, explain(logs));
    const events = logs.stdout.trim().split("\n").map((line) => JSON.parse(line));
    assert.ok(
      events.some((e) => e.type === "tool_call" && e.tool_name === "environment_write_file"),
      logs.stdout,
    );
    assert.equal(events.at(-1).type, "usage");
  },
});

Deno.test({
  name: "two environments at once are two sandboxes; discard brings nothing back",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using fixture = await McpFixture.open("mcp2");
    await using mcp = await fixture.client();
    const [one, two] = await Promise.all([
      mcp.ok("environment_open", {}),
      mcp.ok("environment_open", { branch: "feature/two" }),
    ]);
    assert.notEqual(one.container, two.container);
    await mcp.ok("environment_write_file", {
      environment_id: one.environment_id,
      path: "only-in-one.txt",
      content: "1\n",
    });
    const seen = await mcp.ok("environment_run", {
      environment_id: two.environment_id,
      command: "ls; ls /workspace/worktrees",
    });
    assert.doesNotMatch(seen.stdout, /only-in-one/);
    assert.doesNotMatch(seen.stdout, new RegExp(one.environment_id));
    await mcp.ok("environment_discard", { environment_id: one.environment_id });
    assert.ok(await fixture.containerGone(one.container));
    await assert.rejects(git(fixture.repo, "rev-parse", "--verify", one.branch));
    await mcp.ok("environment_write_file", {
      environment_id: two.environment_id,
      path: "two.txt",
      content: "2\n",
    });
    const back = await mcp.ok("environment_finish", { environment_id: two.environment_id });
    assert.equal(back.branch, "feature/two");
    assert.equal(await git(fixture.repo, "show", "feature/two:two.txt"), "2");
  },
});

Deno.test({
  name:
    "with a warm pool, an environment claims a ready sandbox, and the pool is refilled behind it",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using fixture = await McpFixture.open("mcppool");
    fixture.config = await writeConfig(
      fixture.dir.path,
      `profiles:\n  ${fixture.profile}:\n` +
        `    llm: {provider: custom, base_url: "http://127.0.0.1:9/v1", key: {env: UNUSED}}\n` +
        "    sandbox: {pool: 1}\n",
    );
    const up = await fixture.cli(["up", "-p", fixture.profile, "--repo", fixture.repo]);
    assert.equal(up.exitCode, 0, explain(up));
    const [ready, ...more] = await fixture.containers();
    assert.ok(ready && more.length === 0, `one ready sandbox: ${ready} ${more}`);
    {
      await using mcp = await fixture.client();
      const opened = await mcp.ok("environment_open", {});
      assert.equal(opened.container, ready);
      await mcp.ok("environment_write_file", {
        environment_id: opened.environment_id,
        path: "p.txt",
        content: "pool\n",
      });
      const back = await mcp.ok("environment_finish", { environment_id: opened.environment_id });
      assert.equal(await git(fixture.repo, "show", `${back.branch}:p.txt`), "pool");
    }
    assert.ok(await fixture.containerGone(ready), `${ready} was not destroyed`);
    const refilled = await fixture.containers();
    assert.equal(refilled.length, 1, `the pool holds one ready sandbox again: ${refilled}`);
    assert.notEqual(refilled[0], ready);
  },
});

Deno.test({
  name:
    "a person attached to an MCP environment sees what the client does as it happens, and the attach ends with the environment",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using fixture = await McpFixture.open("mcp-watch");
    await using mcp = await fixture.client();
    const opened = await mcp.ok("environment_open", {});
    const id: string = opened.environment_id;
    const watcher = spawnCli(["attach", id], { config: fixture.config, env: fixture.env });
    const seen: string[] = [];
    const reading = (async () => {
      for await (const line of watcher.lines()) seen.push(line);
    })();
    await mcp.ok("environment_run", { environment_id: id, command: "echo watched-$((6*7))" });
    // The command and its output reach the attached viewer while the environment lives.
    while (!seen.some((line) => line.includes("watched-42"))) {
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    await mcp.ok("environment_discard", { environment_id: id });
    await reading;
    const outcome = await watcher.finished;
    assert.equal(outcome.exitCode, 0, outcome.stderrTail);
    for (const line of seen) JSON.parse(line); // NDJSON, one event per line
    assert.ok(seen.some((line) => line.includes('"type":"tool_call"')), seen.join("\n"));
  },
});
