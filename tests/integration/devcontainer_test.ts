/**
 * Sandbox mode devcontainer against a real engine, offline: fixture repositories made by the test
 * (their devcontainer configuration committed), the real CLI as a subprocess, the scripted fake LLM
 * on 127.0.0.1. The agent's commands run in the repository's own environment — the image's tools,
 * its environment, its user, what its lifecycle commands left — inside the same hardened container
 * as mode container, and the work comes back as a branch. Images are rebuilt when what they are
 * built from changes, and only then.
 */
import assert from "node:assert/strict";
import { run } from "../../lib/process.ts";
import { parseConfig, resolveProfile } from "../../lib/config.ts";
import { DockerCli } from "../../lib/sandbox/docker.ts";
import { openDevcontainer } from "../../lib/sandbox/devcontainer/provider.ts";
import { FakeLlm, text, toolCall } from "../_fake_llm.ts";
import { assertDocker, docker, dockerTest, explain, tempDir } from "../_helpers.ts";
import {
  commitFiles,
  DevcontainerFixture,
  executeOutputs,
  git,
  keyValues,
  parseLines,
} from "../_devcontainer_fixture.ts";

console.error("integration: devcontainer tests starting");

/** A unique mark per test run, so that each fixture builds its own images. */
const MARK = crypto.randomUUID().slice(0, 8);

const BUILD_REPO: Record<string, string> = {
  ".devcontainer/devcontainer.json": `{
  // JSONC: comments and trailing commas are fine
  "name": "build fixture",
  "build": {
    "dockerfile": "Dockerfile",
    "args": { "TOOL_MARK": "${MARK}" },
    "target": "dev",
  },
  "features": { "./greeter": { "greeting": "bonjour" } },
  "containerEnv": {
    "DC_CONTAINER_ENV": "from-containerEnv",
    "DC_LOCAL_ENV": "\${localEnv:DC_TEST_GREETING}",
    "DC_BASENAME": "\${localWorkspaceFolderBasename}",
  },
  "remoteEnv": { "DC_REMOTE_PATH": "\${containerEnv:PATH}:/opt/extra" },
  "remoteUser": "dev",
  "workspaceFolder": "/workspaces/app",
  "onCreateCommand": ["sh", "-c", "echo onCreate >> $HOME/lifecycle.log"],
  "updateContentCommand": "echo updateContent >> $HOME/lifecycle.log",
  "postCreateCommand": "echo \\"marker by $(id -un) in $(pwd -P) token=\${SANDBOX_LLM_TOKEN:-none}\\" > $HOME/postcreate-marker && echo postCreate >> $HOME/lifecycle.log && echo postcreate-says-hello",
  "postStartCommand": { "first": "echo postStart-a >> $HOME/start-a.log", "second": ["sh", "-c", "echo postStart-b >> $HOME/start-b.log"] },
}
`,
  ".devcontainer/Dockerfile": `FROM sandbox-base:bookworm AS dev
ARG TOOL_MARK
RUN printf '#!/bin/sh\\necho "dc-tool %s"\\n' "$TOOL_MARK" > /usr/local/bin/dc-tool && chmod 0755 /usr/local/bin/dc-tool \\
 && useradd --create-home --uid 1000 --shell /bin/bash dev \\
 && echo "owned by dev" > /home/dev/dev-file && chown dev:dev /home/dev/dev-file
FROM dev AS release
RUN echo 'echo "release stage: build.target was not honoured"' > /usr/local/bin/dc-tool
`,
  ".devcontainer/greeter/devcontainer-feature.json": `{
  "id": "greeter", "version": "1.0.0", "name": "Greeter",
  "options": { "greeting": { "type": "string", "default": "hello" } },
  "containerEnv": { "GREETER_FEATURE": "installed" }
}
`,
  ".devcontainer/greeter/install.sh": `#!/bin/sh
set -e
printf '#!/bin/sh\\necho "greeter says %s (installed for %s)"\\n' "$GREETING" "$_REMOTE_USER" > /usr/local/bin/greet
chmod 0755 /usr/local/bin/greet
`,
  "README.md": "the fixture repository\n",
};

Deno.test({
  name:
    "run agentic --repo in a devcontainer built from a Dockerfile: the agent's command sees the image's tool, the environment, the lifecycle marker and the user, and the work comes back as a branch",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    const probe = [
      "echo MARK-START",
      "dc-tool",
      "greet",
      "echo USER=$(id -un) UID=$(id -u)",
      "echo DC_CONTAINER_ENV=$DC_CONTAINER_ENV",
      "echo DC_LOCAL_ENV=$DC_LOCAL_ENV",
      "echo DC_BASENAME=$DC_BASENAME",
      "echo DC_REMOTE_PATH=$DC_REMOTE_PATH",
      "echo GREETER_FEATURE=$GREETER_FEATURE",
      "echo MARKER=$(cat $HOME/postcreate-marker)",
      "echo LIFECYCLE=$(cat $HOME/lifecycle.log | tr '\\n' ,)",
      "echo STARTS=$(cat $HOME/start-a.log $HOME/start-b.log | tr '\\n' ,)",
      "echo DEVFILE=$(stat -c %u /home/dev/dev-file)",
      "echo WORKSPACE=$(readlink -f /workspaces/app)",
      "echo PWD=$(pwd)",
      "echo CAPEFF=$(grep CapEff /proc/self/status | cut -f2)",
      "echo MARK-END",
    ].join("; ");
    await using llm = new FakeLlm([
      toolCall("execute", { command: probe }),
      toolCall("write_file", { file_path: "agent.txt", content: "written in the devcontainer\n" }),
      text("Done"),
    ]);
    await using fixture = await DevcontainerFixture.create("it-dc-build", llm.baseUrl, BUILD_REPO);
    const result = await fixture.runAgent({ DC_TEST_GREETING: "hello-from-the-host" });
    const context = explain(result);
    assert.equal(result.exitCode, 0, context);
    const [output] = executeOutputs(parseLines(result.stdout, context));
    assert.ok(output?.includes("MARK-END"), `the agent's command never ran\n${context}`);
    const seen = keyValues(output);

    await t.step(
      "the image's tool (built with build.args and build.target) and the local feature's tool are there",
      () => {
        assert.match(output, new RegExp(`^dc-tool ${MARK}$`, "m"), context);
        assert.match(output, /^greeter says bonjour \(installed for dev\)$/m, context);
        assert.equal(seen.GREETER_FEATURE, "installed", context);
      },
    );

    await t.step(
      "containerEnv (with ${localEnv} and ${localWorkspaceFolderBasename}) and remoteEnv (with ${containerEnv}) are set",
      () => {
        assert.equal(seen.DC_CONTAINER_ENV, "from-containerEnv", context);
        assert.equal(seen.DC_LOCAL_ENV, "hello-from-the-host", context);
        assert.equal(seen.DC_BASENAME, "it-dc-build-repo", context);
        assert.match(seen.DC_REMOTE_PATH, /^\/usr\/local\/sbin:.*:\/opt\/extra$/, context);
      },
    );

    await t.step(
      "the agent runs as the devcontainer's remoteUser, mapped to the sandbox uid, with no capability",
      () => {
        assert.match(output, /^USER=dev UID=10001$/m, context);
        assert.equal(seen.DEVFILE, "10001", `dev's files follow it to the sandbox uid\n${context}`);
        assert.equal(seen.CAPEFF, "0000000000000000", context);
      },
    );

    await t.step(
      "the lifecycle commands ran in order, in the workspace folder, without the LLM token, output on stderr",
      () => {
        const worktree = seen.WORKSPACE;
        assert.match(worktree, /^\/workspace\/worktrees\/[^/]+$/, context);
        // The workspace folder is a link to the run's worktree; the commands run there.
        assert.equal(seen.MARKER, `marker by dev in ${worktree} token=none`, context);
        assert.equal(seen.LIFECYCLE, "onCreate,updateContent,postCreate,", context);
        assert.equal(seen.STARTS, "postStart-a,postStart-b,", context);
        assert.equal(
          seen.PWD,
          worktree,
          `the agent works in the workspace folder's worktree\n${context}`,
        );
        assert.match(
          result.stderr,
          /^sandbox: postCreateCommand: postcreate-says-hello$/m,
          context,
        );
        assert.match(result.stderr, /^sandbox: postStartCommand\.second: running /m, context);
        assert.ok(
          !result.stdout.includes("postcreate-says-hello"),
          `lifecycle output is not on stdout\n${context}`,
        );
      },
    );

    await t.step("the agent's work comes back as a branch of the user's repository", async () => {
      const branch = (await git(
        fixture.repo,
        "for-each-ref",
        "--format=%(refname:short)",
        "refs/heads/sandbox/",
      )).trim();
      assert.ok(branch, context);
      assert.equal(
        await git(fixture.repo, "show", `${branch}:agent.txt`),
        "written in the devcontainer",
      );
    });
  },
});

Deno.test({
  name:
    "an image-only devcontainer: up, exec, runs, status and down work as for docker, and up finds the repository from the current directory",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    await using llm = new FakeLlm([
      toolCall("execute", { command: "echo PWD=$(pwd); echo ONLY=$DC_ONLY; id -un" }),
      text("Done"),
    ]);
    await using fixture = await DevcontainerFixture.create("it-dc-image", llm.baseUrl, {
      ".devcontainer.json":
        `{ "image": "sandbox-base:bookworm", "containerEnv": { "DC_ONLY": "image-${MARK}" } }\n`,
    });

    let pooled = "";
    await t.step(
      "up in the repository's directory builds it and fills the repository's warm pool",
      async () => {
        const up = await run([
          Deno.execPath(),
          "run",
          "-A",
          "--quiet",
          `${new URL("../../cli.ts", import.meta.url).pathname}`,
          "--config",
          fixture.config,
          "up",
          "-p",
          fixture.profile,
          "--json",
        ], {
          cwd: fixture.repo,
          env: fixture.env,
          timeoutMs: 240_000,
        });
        assert.equal(up.exitCode, 0, explain(up));
        const { ready } = JSON.parse(up.stdout);
        assert.equal(ready.length, 1, explain(up));
        assert.match(ready[0], new RegExp(`^${fixture.container}-p[0-9a-f]{8}$`), explain(up));
        pooled = ready[0];
        assert.equal(await docker("inspect", "--format", "{{.State.Running}}", pooled), "true");
      },
    );

    await t.step(
      "exec --repo runs in the devcontainer's environment, as the sandbox user",
      async () => {
        const exec = await fixture.cli([
          "exec",
          "-p",
          fixture.profile,
          "--repo",
          fixture.repo,
          "--",
          "sh",
          "-c",
          "echo $DC_ONLY; id -un; id -u",
        ]);
        assert.equal(exec.exitCode, 0, explain(exec));
        assert.equal(exec.stdout, `image-${MARK}\nsandbox\n10001\n`, explain(exec));
      },
    );

    await t.step(
      "a run claims the pooled container up made, works in the default workspace folder with the devcontainer's environment",
      async () => {
        const result = await fixture.runAgent();
        assert.equal(result.exitCode, 0, explain(result));
        const id = /run (\S+) \(/.exec(result.stderr)?.[1];
        assert.ok(id, explain(result));
        assert.equal((await fixture.meta(id)).extra?.container, pooled, explain(result));
        const [output] = executeOutputs(parseLines(result.stdout, explain(result)));
        assert.match(output, /^PWD=\/workspace\/worktrees\//m, explain(result));
        assert.match(output, new RegExp(`^ONLY=image-${MARK}$`, "m"), explain(result));
      },
    );

    await t.step(
      "status lists the development sandbox, and down removes it and the refilled pool; the run's container went with the run",
      async () => {
        const status = await fixture.cli(["status", "--json"]);
        assert.equal(status.exitCode, 0, explain(status));
        assert.ok(
          JSON.parse(status.stdout).some((s: { name: string }) => s.name === fixture.container),
          explain(status),
        );
        const down = await fixture.cli(["down", "-p", fixture.profile, "--json"]);
        assert.equal(down.exitCode, 0, explain(down));
        const containers: string[] = JSON.parse(down.stdout).containers;
        assert.ok(containers.includes(fixture.container), explain(down));
        assert.ok(
          !containers.includes(pooled),
          `the run's container outlived the run\n${explain(down)}`,
        );
        for (const name of containers.filter((name) => name !== fixture.container)) {
          assert.match(name, new RegExp(`^${fixture.container}-p[0-9a-f]{8}$`), explain(down));
        }
        const gone = await run(["docker", "container", "inspect", fixture.container]);
        assert.notEqual(gone.exitCode, 0, "the development sandbox is still there");
        // The run's container is removed detached, moments after its CLI exits.
        let removed = false;
        for (let i = 0; i < 600 && !removed; i++) {
          removed = (await run(["docker", "container", "inspect", pooled])).exitCode !== 0;
          if (!removed) await new Promise((resolve) => setTimeout(resolve, 100));
        }
        assert.ok(removed, `the run's container ${pooled} is still there`);
      },
    );
  },
});

Deno.test({
  name:
    "the devcontainer image is rebuilt when its Dockerfile changes, and not when it is unchanged or another file changes",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    await using dir = await tempDir("sandbox-it-dc-cache-");
    const repo = `${dir.path}/repo`;
    await Deno.mkdir(repo);
    await git(repo, "init", "-q", "-b", "main");
    await commitFiles(repo, {
      ".devcontainer/devcontainer.json": `{ "build": { "dockerfile": "Dockerfile" } }\n`,
      ".devcontainer/Dockerfile":
        `FROM sandbox-base:bookworm\nRUN echo "version one ${MARK}" > /etc/dc-version\n`,
      "README.md": "one\n",
    }, "one");
    const parsed = parseConfig(`profiles:\n  cache: {sandbox: {mode: devcontainer}}\n`);
    assert.equal(parsed.kind, "ok");
    const profile = resolveProfile(
      parsed.kind === "ok" ? parsed.config : { profiles: {} },
      "cache",
    );
    const docker = new DockerCli();
    const tags: string[] = [];
    try {
      const open = async () => {
        const lines: string[] = [];
        const dc = await openDevcontainer(profile, {
          repo,
          docker,
          onProgress: (line) => lines.push(line),
        });
        tags.push(dc.image.tag);
        return { dc, lines, id: await dockerId(dc.image.tag) };
      };
      const first = await open();
      await t.step("the first use builds it", () => {
        assert.equal(first.dc.image.built, true);
        assert.ok(
          first.lines.some((l) => l.startsWith("Building devcontainer image")),
          first.lines.join("\n"),
        );
      });
      await t.step("unchanged: no build, the same image", async () => {
        const again = await open();
        assert.equal(again.dc.image.built, false);
        assert.equal(again.dc.image.tag, first.dc.image.tag);
        assert.equal(again.id, first.id);
        assert.ok(!again.lines.some((l) => l.startsWith("Building")), again.lines.join("\n"));
      });
      await t.step("a change outside what it is built from: no build", async () => {
        await commitFiles(repo, { "README.md": "two\n" }, "readme");
        const readme = await open();
        assert.equal(readme.dc.image.built, false);
        assert.equal(readme.id, first.id);
      });
      await t.step("a changed Dockerfile: a new image, built", async () => {
        await commitFiles(repo, {
          ".devcontainer/Dockerfile":
            `FROM sandbox-base:bookworm\nRUN echo "version two ${MARK}" > /etc/dc-version\n`,
        }, "two");
        const changed = await open();
        assert.equal(changed.dc.image.built, true);
        assert.notEqual(changed.dc.image.tag, first.dc.image.tag);
        assert.notEqual(changed.id, first.id);
        const version = await docker.run([
          "run",
          "--rm",
          "--network",
          "none",
          changed.dc.image.tag,
          "cat",
          "/etc/dc-version",
        ]);
        assert.equal(version.stdout, `version two ${MARK}\n`, version.stderr);
      });
    } finally {
      for (const tag of tags.reverse()) await run(["docker", "image", "rm", "--force", tag]);
    }
  },
});

async function dockerId(ref: string): Promise<string> {
  return await docker("image", "inspect", "--format", "{{.Id}}", ref);
}

Deno.test({
  name:
    "a remote feature whose registry cannot be reached fails the build clearly: exit 125, the feature named, and what to do",
  ...dockerTest(),
  async fn() {
    assertDocker();
    // A registry address on this machine that refuses connections: nothing leaves the host.
    const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
    const port = (listener.addr as Deno.NetAddr).port;
    listener.close();
    const feature = `127.0.0.1:${port}/devcontainers/features/node:1`;
    await using fixture = await DevcontainerFixture.create(
      "it-dc-remote",
      "http://127.0.0.1:9/v1",
      {
        ".devcontainer/devcontainer.json":
          `{ "image": "sandbox-base:bookworm", "features": { "${feature}": {} } }\n`,
      },
    );
    const up = await fixture.cli(["up", "-p", fixture.profile, "--repo", fixture.repo]);
    const context = explain(up);
    assert.equal(up.exitCode, 125, context);
    assert.match(
      up.stderr,
      new RegExp(
        `error: Cannot build the devcontainer of ".*": feature "${
          feature.replaceAll(".", "\\.")
        }" cannot be fetched from 127\\.0\\.0\\.1:${port}`,
      ),
      context,
    );
    assert.match(
      up.stderr,
      /copy the feature into the repository .*\.devcontainer\/node\/.* "\.\/node"/,
      context,
    );
    assert.doesNotMatch(up.stderr, /^\s+at /m, `no stack trace\n${context}`);
    const container = await run(["docker", "container", "inspect", fixture.container]);
    assert.notEqual(container.exitCode, 0, "no container was started");
  },
});

Deno.test({
  name:
    "an image that lacks what the sandbox layer needs, and apt-get to add it, fails naming what is missing",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using fixture = await DevcontainerFixture.create(
      "it-dc-lacking",
      "http://127.0.0.1:9/v1",
      {
        ".devcontainer/devcontainer.json": `{ "build": { "dockerfile": "Dockerfile" } }\n`,
        ".devcontainer/Dockerfile":
          `FROM sandbox-base:bookworm\nRUN rm -f /usr/bin/pkill /usr/bin/apt-get && echo ${MARK} >/etc/mark\n`,
      },
    );
    const up = await fixture.cli(["up", "-p", fixture.profile, "--repo", fixture.repo]);
    const context = explain(up);
    assert.equal(up.exitCode, 125, context);
    assert.match(
      up.stderr,
      /error: Cannot use the devcontainer image of ".*": it lacks pkill \(and apt-get to add them\)/,
      context,
    );
    assert.match(up.stderr, /Install procps/, context);
  },
});

Deno.test({
  name:
    "a Dockerfile step that fails ends up with exit 125 naming the failure, no stack trace, and no container or image left behind",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using fixture = await DevcontainerFixture.create(
      "it-dc-failing",
      "http://127.0.0.1:9/v1",
      {
        ".devcontainer/devcontainer.json": `{ "build": { "dockerfile": "Dockerfile" } }\n`,
        ".devcontainer/Dockerfile":
          `FROM sandbox-base:bookworm AS base\nRUN echo ${MARK} > /etc/mark\nFROM base\nRUN echo "step fails on purpose" && exit 7\n`,
      },
    );
    const up = await fixture.cli(["up", "-p", fixture.profile, "--repo", fixture.repo]);
    const context = explain(up);
    assert.equal(up.exitCode, 125, context);
    assert.match(
      up.stderr,
      /error: Cannot build the devcontainer of ".*": An error occurred building the image/,
      context,
    );
    assert.match(up.stderr, /returned a non-zero code: 7/, context);
    assert.doesNotMatch(up.stderr, /^\s*sandbox:\s+at /m, `no stack trace\n${context}`);
    const steps = [...up.stderr.matchAll(/Running in ([0-9a-f]{12})/g)].map((m) => m[1]);
    assert.ok(steps.length > 0, context);
    for (const id of steps) {
      const left = await run(["docker", "container", "inspect", id]);
      assert.notEqual(left.exitCode, 0, `the build's container ${id} was left behind`);
    }
    const images = [...up.stderr.matchAll(/---> ([0-9a-f]{12})$/gm)].map((m) => m[1]);
    const dangling = (await run(["docker", "images", "--filter", "dangling=true", "--quiet"]))
      .stdout.split("\n");
    assert.deepEqual(
      images.filter((id) => dangling.includes(id)),
      [],
      "the build's stage images were left behind",
    );
  },
});
