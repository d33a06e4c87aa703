/**
 * Which of a repository's agent CLI configuration a run lets the agent read
 * (lib/agents/project_config.ts): only what is in the base commit and trusted by content, every
 * file of a directory; never a symbolic link; a summary of each file that cannot write terminal
 * escapes.
 */
import assert from "node:assert/strict";
import { run } from "../../lib/process.ts";
import {
  checkAgentProjectConfig,
  describeIgnored,
  summarizeAgentFile,
} from "../../lib/agents/project_config.ts";
import { trustContent } from "../../lib/trust.ts";
import { tempDir } from "../_helpers.ts";

async function git(cwd: string, ...args: string[]): Promise<string> {
  const result = await run([
    "git",
    "-C",
    cwd,
    "-c",
    "user.name=t",
    "-c",
    "user.email=t@example.test",
    "-c",
    "commit.gpgsign=false",
    ...args,
  ]);
  assert.equal(result.exitCode, 0, result.stderr);
  return result.stdout.trim();
}

/** Write `files` (a value starting with "->" is a symbolic link to the rest) and commit; the commit. */
async function commit(repo: string, files: Record<string, string>): Promise<string> {
  for (const [name, content] of Object.entries(files)) {
    const file = `${repo}/${name}`;
    await Deno.mkdir(file.slice(0, file.lastIndexOf("/")), { recursive: true });
    if (content.startsWith("->")) await Deno.symlink(content.slice(2), file);
    else await Deno.writeTextFile(file, content);
  }
  await git(repo, "add", "-A");
  await git(repo, "commit", "-q", "-m", "change");
  return await git(repo, "rev-parse", "HEAD");
}

const SETTINGS = JSON.stringify({
  hooks: { UserPromptSubmit: [] },
  env: { ANTHROPIC_BASE_URL: "http://x" },
});

Deno.test("agent configuration is used only when its committed content is trusted, every file of it", async (t) => {
  await using dir = await tempDir("sandbox-agentcfg-");
  const repo = `${dir.path}/repo`;
  await Deno.mkdir(repo);
  await git(repo, "init", "-q", "-b", "main");
  const store = `${dir.path}/trusted.json`;
  let base = await commit(repo, {
    ".claude/settings.json": SETTINGS,
    ".claude/skills/s/SKILL.md": "skill\n",
    ".mcp.json": "{}",
    ".codex/config.toml": "x = 1\n",
    "README.md": "hi\n",
  });
  const check = (agent: "claude-code" | "codex") =>
    checkAgentProjectConfig(agent, { path: repo, base }, { trustStore: store });

  await t.step("untrusted: nothing is used, and each file is named", async () => {
    const claude = await check("claude-code");
    assert.deepEqual(claude.trusted, []);
    assert.deepEqual(
      claude.ignored.map((u) => [u.unit.path, u.files.map((f) => `${f.path} ${f.state}`)]),
      [
        [".claude", [".claude/settings.json untrusted", ".claude/skills/s/SKILL.md untrusted"]],
        [".mcp.json", [".mcp.json untrusted"]],
      ],
    );
    assert.deepEqual((await check("codex")).ignored.map((u) => u.unit.path), [".codex"]);
  });

  await t.step("a directory is used only when every file of it is trusted", async () => {
    await trustContent(`${repo}/.claude/settings.json`, new TextEncoder().encode(SETTINGS), store);
    await trustContent(`${repo}/.mcp.json`, new TextEncoder().encode("{}"), store);
    const partly = await check("claude-code");
    assert.deepEqual(partly.trusted, [".mcp.json"]);
    assert.deepEqual(partly.ignored[0].files.map((f) => f.path), [".claude/skills/s/SKILL.md"]);
    await trustContent(
      `${repo}/.claude/skills/s/SKILL.md`,
      new TextEncoder().encode("skill\n"),
      store,
    );
    assert.deepEqual((await check("claude-code")).trusted, [".claude", ".mcp.json"]);
    assert.deepEqual(
      (await check("codex")).trusted,
      [],
      "another agent's files are not trusted with them",
    );
  });

  await t.step(
    "what counts is the commit: a new commit with other content is not trusted; the working tree is never read",
    async () => {
      base = await commit(repo, { ".mcp.json": '{"mcpServers": {"x": {"command": "sh"}}}' });
      await Deno.writeTextFile(`${repo}/.mcp.json`, "{}");
      const changed = await check("claude-code");
      assert.deepEqual(changed.trusted, [".claude"]);
      assert.deepEqual(changed.ignored[0].files.map((f) => `${f.path} ${f.state}`), [
        ".mcp.json changed",
      ]);
      assert.deepEqual(changed.ignored[0].files[0].summary, ['MCP server "x" (runs "sh")']);
    },
  );

  await t.step("a symbolic link is never trusted, and keeps its directory out", async () => {
    await Deno.remove(`${repo}/.mcp.json`);
    base = await commit(repo, { ".claude/link.json": "->/etc/passwd", ".mcp.json": "{}" });
    const linked = await check("claude-code");
    assert.deepEqual(linked.trusted, [".mcp.json"]);
    assert.deepEqual(linked.ignored[0].files.map((f) => `${f.path} ${f.state}`), [
      ".claude/link.json not a regular file",
    ]);
    const lines = describeIgnored("claude-code", linked).join("\n");
    assert.match(
      lines,
      /"\.claude\/link\.json": a symbolic link: never used, and keeps \.claude out while it is committed/,
    );
    assert.match(lines, /only regular files of reasonable size can be trusted/);
  });

  await t.step("without a repository on this machine nothing is trusted", async () => {
    assert.deepEqual(
      await checkAgentProjectConfig("claude-code", undefined, { trustStore: store }),
      { trusted: [], ignored: [] },
    );
  });
});

Deno.test("the summary of an agent file says what it would change and cannot write terminal escapes", () => {
  const bytes = (text: string) => new TextEncoder().encode(text);
  const settings = summarizeAgentFile(
    ".claude/settings.json",
    bytes(JSON.stringify({
      hooks: { "Stop\u001b[2J": [] },
      env: { OPENAI_BASE_URL: "x" },
      apiKeyHelper: "echo \u009b31m",
      permissions: {},
    })),
  );
  assert.deepEqual(settings, [
    'hooks "Stop\\u001b[2J" (commands the agent runs, given the prompt, in its environment)',
    `env "OPENAI_BASE_URL" (the agent's environment; a *_BASE_URL is where the agent's LLM calls go)`,
    'apiKeyHelper "echo \\u009b31m" (a command the agent runs)',
    'also "permissions"',
  ]);
  // deno-lint-ignore no-control-regex -- finding control characters is the point
  for (const line of settings) assert.ok(!/[\u0000-\u001f\u007f-\u009f]/.test(line), line);
  assert.deepEqual(
    summarizeAgentFile(".mcp.json", bytes('{"mcpServers": {"a": {"url": "http://h"}}}')),
    ['MCP server "a" (at "http://h")'],
  );
  assert.deepEqual(
    summarizeAgentFile(
      ".codex/config.toml",
      bytes('model = "x"\n[mcp_servers.evil]\ncommand = "sh"\n[[hooks.Stop]]\n'),
    ),
    [
      'sets "model"',
      'tables "mcp_servers.evil", "hooks.Stop"',
    ],
  );
  assert.deepEqual(summarizeAgentFile(".claude/settings.json", bytes("{not json")), [
    "(not valid JSON)",
  ]);
  assert.deepEqual(summarizeAgentFile(".claude/agents/a.md", bytes("hello")), [
    "5 bytes the agent reads as project configuration",
  ]);
});
