/**
 * The installed CLI is self-contained and runs clean: `deno task install` puts a launcher on the
 * PATH (here a temporary directory) that runs the bundle; from an empty directory it completes an
 * offline agent run (the shipped replay recording) in a sandbox with nothing but its own lines on
 * stderr, and it shares the sandbox image (and so the sandbox) with the checkout; in mode none it
 * runs the worker it carries at the end of its file, the checkout's byte for byte.
 */
import assert from "node:assert/strict";
import { run } from "../../lib/process.ts";
import { decodeMessage } from "../../lib/run/protocol.ts";
import { costOf } from "../../lib/run/prices.ts";
import { sha256HexOf } from "../../lib/hash.ts";
import { workerContentHash } from "../../lib/sandbox/worker_bundle.ts";
import {
  assertDocker,
  docker,
  dockerTest,
  explain,
  removeProfile,
  ROOT,
  runCli,
  tempDir,
  uniqueProfile,
  writeConfig,
} from "../_helpers.ts";
import denoJson from "../../deno.json" with { type: "json" };
import { DatabaseSync } from "node:sqlite";

/** The local modules whose compiled code a Deno cache database holds. */
function cachedSpecifiers(database: string): string[] {
  const db = new DatabaseSync(database, { readOnly: true });
  try {
    const rows = db.prepare(
      "select specifier from codecache where specifier like 'file:%' order by specifier",
    ).all();
    return rows.map((row) => String(row.specifier));
  } finally {
    db.close();
  }
}

Deno.test({
  name:
    "deno task install puts sandbox on the PATH; from an empty directory it runs an offline replay clean and shares the checkout's sandbox",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    await using prefix = await tempDir("sandbox-install-");
    await using empty = await tempDir("sandbox-bundle-");
    const bin = `${prefix.path}/bin`;
    const profile = uniqueProfile("e2e-bundle");
    const config = await writeConfig(
      empty.path,
      `profiles:\n  ${profile}: {}\n  ${profile}-host: {sandbox: {mode: none}}\n`,
    );
    const state = `${empty.path}/state`;
    const pathWithout = (Deno.env.get("PATH") ?? "").split(":").filter((d) => d !== bin).join(":");

    try {
      await t.step(
        "install writes the launcher and the bundle, and says the directory is not on PATH",
        async () => {
          const installed = await run([Deno.execPath(), "task", "install"], {
            cwd: ROOT,
            env: { SANDBOX_INSTALL_DIR: bin, PATH: pathWithout },
            timeoutMs: 300_000,
          });
          assert.equal(installed.exitCode, 0, explain(installed));
          assert.match(
            installed.stderr,
            new RegExp(`install: installed sandbox ${denoJson.version}: ${bin}/sandbox`),
            explain(installed),
          );
          assert.match(
            installed.stderr,
            new RegExp(`${bin} is not on your PATH`),
            explain(installed),
          );
          const launcher = await Deno.readTextFile(`${bin}/sandbox`);
          assert.ok(
            ((await Deno.stat(`${bin}/sandbox`)).mode ?? 0) & 0o100,
            "the launcher is not executable",
          );
          assert.match(launcher, /run -A --quiet --no-config /);
          for (const feature of denoJson.unstable) {
            assert.ok(launcher.includes(`--unstable-${feature}`), launcher);
          }
          // The launcher runs the small start file, which imports the bundle beside it.
          assert.ok(launcher.includes(`${prefix.path}/lib/sandbox/sandbox-start.js`), launcher);
          await Deno.stat(`${prefix.path}/lib/sandbox/sandbox.js`);
          const startBytes = (await Deno.stat(`${prefix.path}/lib/sandbox/sandbox-start.js`)).size;
          assert.ok(startBytes < 64 * 1024, `the start file is ${startBytes} bytes`);
        },
      );

      await Deno.copyFile(`${ROOT}/examples/hello/prompt.txt`, `${empty.path}/prompt.txt`);
      await Deno.copyFile(`${ROOT}/examples/hello/recording.json`, `${empty.path}/recording.json`);
      // Run as a user would: by name, found on PATH, from a directory holding no checkout.
      const sandbox = (...args: string[]) =>
        run(["sandbox", ...args], {
          cwd: empty.path,
          env: { PATH: `${bin}:${pathWithout}`, XDG_STATE_HOME: state, SANDBOX_CONFIG: config },
          timeoutMs: 300_000,
        });

      await t.step("sandbox --version runs from the PATH with nothing on stderr", async () => {
        const version = await sandbox("--version");
        assert.equal(version.exitCode, 0, explain(version));
        assert.equal(version.stdout.trim(), denoJson.version);
        assert.equal(version.stderr, "");
      });

      let imageId = "";
      let containerId = "";
      await t.step("the checkout fills the profile's warm pool", async () => {
        const up = await runCli(["up", "-p", profile, "--json"], {
          config,
          env: { XDG_STATE_HOME: state },
        });
        assert.equal(up.exitCode, 0, explain(up));
        const [ready] = JSON.parse(up.stdout).ready as string[];
        imageId = await docker("container", "inspect", "--format", "{{.Image}}", ready);
      });

      await t.step(
        "an offline replayed run completes, with only the tool's own lines on stderr",
        async () => {
          const result = await sandbox(
            "run",
            "agentic",
            "-p",
            profile,
            "--prompt-file",
            "prompt.txt",
            "--model",
            "replay:recording.json",
          );
          const context = explain(result);
          assert.equal(result.exitCode, 0, context);
          const messages = result.stdout.trim().split("\n").map((line, i) =>
            decodeMessage(line, i + 1)
          );
          assert.equal(messages.at(-1)?.type, "usage", context);
          assert.equal(messages.filter((m) => m.type === "result").length, 1, context);
          const ran = messages.find((m) => m.type === "tool_result" && m.tool_name === "execute");
          assert.match(ran?.tool_output ?? "", /Hello from the sandbox, sandbox!/, context);
          // No Deno warning (the unstable flags are the launcher's), no image build: the sandbox the
          // checkout started is the one this run used.
          for (const line of result.stderr.trimEnd().split("\n")) {
            assert.match(line, /^sandbox: /, context);
          }
          assert.doesNotMatch(
            result.stderr,
            /unstable|legacy|warning|Building|Replacing/i,
            context,
          );
          assert.match(result.stderr, /replay with: sandbox logs \S+$/m, context);
          // A replay reports the recorded model's cost.
          const usage = messages.at(-1)!.usage!;
          const recording = JSON.parse(await Deno.readTextFile(`${empty.path}/recording.json`));
          const expected = recording.responses.reduce(
            (
              sum: number,
              r: {
                body: {
                  model: string;
                  usage: { prompt_tokens: number; completion_tokens: number };
                };
              },
            ) =>
              sum +
              costOf(r.body.model, {
                input: r.body.usage.prompt_tokens,
                output: r.body.usage.completion_tokens,
              })!,
            0,
          );
          assert.ok(
            Math.abs((usage.cost_usd ?? -1) - expected) < 1e-9,
            `cost_usd ${usage.cost_usd}, expected ${expected}\n${context}`,
          );
        },
      );

      await t.step(
        "up through the installed bundle finds the pool the checkout's run refilled: same image, nothing built",
        async () => {
          const up = await sandbox("up", "-p", profile, "--json", "--config", config);
          assert.equal(up.exitCode, 0, explain(up));
          const ready = JSON.parse(up.stdout).ready as string[];
          assert.equal(ready.length, 1, explain(up));
          containerId = ready[0];
          assert.equal(
            await docker("container", "inspect", "--format", "{{.Image}}", containerId),
            imageId,
            explain(up),
          );
          assert.equal(up.stderr, "", explain(up));
        },
      );

      // Through every module `exec` loads lazily (in the bundle, modules that import each other in a
      // cycle and load lazily wait for each other for ever).
      await t.step("exec through the installed bundle runs its command, twice", async () => {
        for (const word of ["one", "two"]) {
          const result = await sandbox("exec", "-p", profile, "--", "echo", word);
          assert.equal(result.exitCode, 0, explain(result));
          assert.equal(result.stdout, `${word}\n`, explain(result));
        }
      });
      // Deno writes a module's compiled code only once its evaluation is complete: the entries
      // exit on the next turn (cli.ts exitSoon, the relay's --check), so one `--version` of the
      // bundle, and the image build's check of the relay, leave theirs.
      await t.step(
        "one --version leaves the bundle's compiled code in Deno's cache, and the image holds the relay's and the worker's",
        async () => {
          await using denoDir = await tempDir("sandbox-deno-dir-");
          const bundle = `${prefix.path}/lib/sandbox/sandbox.js`;
          const unstable = denoJson.unstable.map((feature) => `--unstable-${feature}`);
          const version = await run([
            Deno.execPath(),
            "run",
            "-A",
            "--quiet",
            "--no-config",
            ...unstable,
            bundle,
            "--version",
          ], {
            env: { DENO_DIR: denoDir.path },
          });
          assert.equal(version.exitCode, 0, explain(version));
          assert.deepEqual(cachedSpecifiers(`${denoDir.path}/v8_code_cache_v2`), [
            `file://${bundle}`,
          ]);
          await docker("cp", `${containerId}:/opt/sandbox/deno-dir/.`, `${denoDir.path}/image`);
          assert.deepEqual(cachedSpecifiers(`${denoDir.path}/image/v8_code_cache_v2`), [
            "file:///opt/sandbox/relay.js",
            "file:///opt/sandbox/worker.js",
          ]);
        },
      );

      // Mode none runs the worker on the host, from the bytes the bundle carries at the end of its
      // file (lib/sandbox/bundle_trailer.ts): read back, they are the checkout's worker.
      await t.step(
        "a run in mode none through the installed bundle runs the worker it carries, the checkout's byte for byte",
        async () => {
          // The checkout's `up` above bundled its own worker into the same state directory.
          await Deno.remove(`${state}/sandbox/worker`, { recursive: true }).catch(() => {});
          const result = await sandbox(
            "run",
            "agentic",
            "-p",
            `${profile}-host`,
            "--prompt-file",
            "prompt.txt",
            "--model",
            "replay:recording.json",
          );
          assert.equal(result.exitCode, 0, explain(result));
          const written = [...Deno.readDirSync(`${state}/sandbox/worker`)].filter((e) =>
            /^worker-.*\.js$/.test(e.name)
          );
          assert.equal(
            written.length,
            1,
            `${written.map((e) => e.name).join(", ")}\n${explain(result)}`,
          );
          const bytes = await Deno.readFile(`${state}/sandbox/worker/${written[0].name}`);
          assert.equal(await sha256HexOf(bytes), await workerContentHash());
        },
      );
    } finally {
      await removeProfile(profile);
    }
  },
});
