/**
 * The CLI's fast path for `run` and `exec` (cli/fast_path.ts) against commander itself: every
 * command line the fast path takes must be read by commander the same way (same command, same
 * options, same arguments), and every other one must be left to commander.
 */
import assert from "node:assert/strict";
import type { Command } from "commander";
import { buildProgram } from "../../cli/main.ts";
import { parseFastPath } from "../../cli/fast_path.ts";
import { tempDir } from "../_helpers.ts";

interface Parsed {
  command: string;
  opts: Record<string, unknown>;
  config: unknown;
  argv?: string[];
}

class Stop extends Error {}

/** What commander makes of `args`: the command it would run, with its options and arguments. */
async function commanderParse(args: string[]): Promise<Parsed> {
  const program = await buildProgram();
  let parsed: Parsed | undefined;
  const capture = (_: Command, action: Command) => {
    const { config: _config, ...opts } = action.opts();
    const path = [];
    for (let c: Command | null = action; c && c !== program; c = c.parent) path.unshift(c.name());
    parsed = {
      command: path.join(" "),
      opts,
      config: action.optsWithGlobals().config,
      argv: action.name() === "exec" ? action.processedArgs[0] as string[] : undefined,
    };
    throw new Stop();
  };
  program.hook("preAction", capture);
  program.exitOverride().configureOutput({ writeErr: () => {}, writeOut: () => {} });
  for (const command of program.commands) {
    command.exitOverride().configureOutput({ writeErr: () => {}, writeOut: () => {} });
  }
  await assert.rejects(
    program.parseAsync(args, { from: "user" }),
    Stop,
    `commander ran ${JSON.stringify(args)}`,
  );
  return parsed!;
}

Deno.test("the fast path reads run and exec command lines exactly as commander does", async (t) => {
  await using dir = await tempDir("sandbox-fast-path-");
  // A named configuration is loaded before any action (commander's preAction hook): a valid one.
  const cfg = `${dir.path}/a.yaml`;
  const cfgB = `${dir.path}/b.yaml`;
  await Deno.writeTextFile(cfg, "profiles: {}\n");
  await Deno.writeTextFile(cfgB, "profiles: {}\n");
  const samples: string[][] = [
    ["run", "agentic", "--prompt-file", "p.txt"],
    ["run", "agentic", "--prompt-file", "-"],
    [
      "-c",
      cfg,
      "run",
      "agentic",
      "--prompt-file=p.txt",
      "-p",
      "work",
      "-m",
      "replay:r.json",
      "--format",
      "ndjson",
    ],
    ["run", "generate", "--prompt-file", "p", "--schema", "s.json", "--config", cfg],
    ["--config", cfg, "run", "agentic", "--prompt-file", "p", "-c", cfgB],
    [
      "--config=" + cfg,
      "run",
      "generate",
      "--prompt-file",
      "p",
      "--format=pretty",
      "--timeout",
      "90s",
    ],
    [
      "run",
      "agentic",
      "--prompt-file",
      "p",
      "--repo",
      ".",
      "--base",
      "HEAD~1",
      "--branch",
      "b",
      "--keep-worktree",
      "--lifecycle-events",
      "--timeout",
      "5s",
      "--record",
      "r.json",
      "--instructions-file",
      "i.txt",
      "--cwd",
      "/x",
    ],
    ["run", "agentic", "--push", "--repo", "https://example.test/x.git", "--prompt-file", "p"],
    ["run", "agentic", "--prompt-file", "p", "--agent", "claude-code"],
    ["run", "agentic", "--prompt-file", "p", "--detach", "--json"],
    ["run", "generate", "-d", "--prompt-file", "p"],
    ["exec", "--", "true"],
    ["exec", "--detach", "--json", "--", "sleep", "9"],
    ["exec", "-d", "true"],
    ["exec", "true"],
    ["exec", "ls", "-la", "--", "x"],
    [
      "exec",
      "-p",
      "work",
      "--cwd",
      "/tmp",
      "-e",
      "A=1",
      "--env=B=2",
      "--timeout",
      "5s",
      "--",
      "sh",
      "-c",
      "echo hi",
    ],
    ["exec", "-c", cfg, "--repo", ".", "--", "git", "status"],
    ["-c", cfg, "exec", "--", "-x"],
    ["exec", "--cwd", "-x", "--", "true"],
    ["exec", "-p", "--", "true"],
    ["run", "agentic", "-m", "--prompt-file", "--prompt-file", "p"],
  ];
  for (const args of samples) {
    await t.step(args.join(" ").replaceAll(dir.path, "DIR"), async () => {
      const fast = parseFastPath(args);
      assert.ok(fast, "the fast path takes it");
      const expected = await commanderParse(args);
      if (fast.kind === "run") {
        assert.equal(expected.command, `run ${fast.mode}`);
        assert.deepEqual(fast.opts, expected.opts);
      } else {
        assert.equal(expected.command, "exec");
        assert.deepEqual(fast.argv, expected.argv);
        assert.deepEqual(fast.opts, expected.opts);
      }
      assert.equal(fast.config, expected.config);
    });
  }
});

Deno.test("the fast path leaves help, mistakes and every other form to commander", () => {
  for (
    const args of [
      [],
      ["--version"],
      ["--help"],
      ["up"],
      ["run"],
      ["run", "agentic"],
      ["run", "bogus", "--prompt-file", "p"],
      ["run", "agentic", "--prompt-file", "p", "-h"],
      ["run", "agentic", "--prompt-file", "p", "--help"],
      ["run", "agentic", "--prompt-file", "p", "--format", "xml"],
      ["run", "agentic", "--prompt-file", "p", "--agent", "bogus"],
      ["run", "generate", "--prompt-file", "p", "--agent", "codex"],
      ["run", "agentic", "-pwork", "--prompt-file", "p"],
      ["run", "agentic", "--prompt-file", "p", "--prompt-file", "q"],
      ["run", "agentic", "--prompt-file", "p", "extra"],
      ["run", "agentic", "--prompt-file", "p", "--"],
      ["run", "agentic", "--prompt-file"],
      ["run", "agentic", "--prompt-file", "p", "--push=yes"],
      ["run", "generate", "--prompt-file", "p", "--repo", "."],
      ["run", "agentic", "--prompt-file", "p", "--unknown"],
      ["run", "agentic", "-p", "--prompt-file", "x"],
      ["exec"],
      ["exec", "--"],
      ["exec", "--bogus", "--", "x"],
      ["exec", "-h"],
      ["-V", "exec", "true"],
      ["--bogus", "run", "agentic", "--prompt-file", "p"],
    ]
  ) {
    assert.equal(parseFastPath(args), undefined, JSON.stringify(args));
  }
});
