/**
 * The Docker Engine API path (lib/sandbox/engine_api.ts) against a fake engine: a real HTTP/1.1
 * server on a Unix socket that answers as dockerd does (exec create, the upgraded multiplexed
 * stream, exec inspect, container/volume/image inspect). No Docker needed.
 */
import assert from "node:assert/strict";
import {
  EngineExec,
  engineSocket,
  execRequestOf,
  resetEngineSocket,
} from "../../lib/sandbox/engine_api.ts";
import { DockerCli } from "../../lib/sandbox/docker.ts";
import { dockerEngine, EngineError, type EngineErrorKind } from "../../lib/sandbox/engine.ts";
import { parseConfig, resolveProfile } from "../../lib/config.ts";
import { DockerSandboxProvider } from "../../lib/sandbox/docker_provider.ts";
import type { SandboxError } from "../../lib/errors.ts";
import { fakeDocker } from "./_fake_docker.ts";
import { spawn } from "../../lib/process.ts";
import { tempDir, withEnv } from "../_helpers.ts";

const encoder = new TextEncoder();
const decoder = new TextDecoder();

interface ExecRecord {
  container: string;
  body: { Cmd: string[]; Env: string[]; User: string; WorkingDir: string; AttachStdin: boolean };
  /** Set once the client closed its side of the attached stream (its input ended). */
  inputEnded: boolean;
  /** Set when the client went away while the command still ran. */
  clientGone: boolean;
}

/** One frame of the multiplexed stream: 1 stdout, 2 stderr. */
function frame(stream: number, text: string): Uint8Array {
  const payload = encoder.encode(text);
  const out = new Uint8Array(8 + payload.byteLength);
  out[0] = stream;
  new DataView(out.buffer).setUint32(4, payload.byteLength);
  out.set(payload, 8);
  return out;
}

async function readRequest(
  conn: Deno.Conn,
): Promise<{ method: string; path: string; body: string; rest: Uint8Array } | undefined> {
  let buffered = new Uint8Array(0);
  const chunk = new Uint8Array(65536);
  while (true) {
    const text = decoder.decode(buffered);
    const end = text.indexOf("\r\n\r\n");
    if (end !== -1) {
      const head = text.slice(0, end);
      const [method, path] = head.split(" ");
      const length = Number(/content-length: (\d+)/i.exec(head)?.[1] ?? 0);
      let body = buffered.subarray(encoder.encode(head).byteLength + 4);
      while (body.byteLength < length) {
        const n = await conn.read(chunk);
        if (n === null) break;
        const joined = new Uint8Array(body.byteLength + n);
        joined.set(body);
        joined.set(chunk.subarray(0, n), body.byteLength);
        body = joined;
      }
      return {
        method,
        path,
        body: decoder.decode(body.subarray(0, length)),
        rest: body.subarray(length),
      };
    }
    const n = await conn.read(chunk);
    if (n === null) return undefined;
    const joined = new Uint8Array(buffered.byteLength + n);
    joined.set(buffered);
    joined.set(chunk.subarray(0, n), buffered.byteLength);
    buffered = joined;
  }
}

async function respond(
  conn: Deno.Conn,
  status: number,
  body: string,
  chunked = false,
): Promise<void> {
  const head = chunked
    ? `HTTP/1.1 ${status} X\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n`
    : `HTTP/1.1 ${status} X\r\nContent-Type: application/json\r\nContent-Length: ${
      encoder.encode(body).byteLength
    }\r\n\r\n`;
  const payload = chunked
    ? body.match(/[\s\S]{1,7}/g)!.map((part) =>
      `${encoder.encode(part).byteLength.toString(16)}\r\n${part}\r\n`
    ).join("") + "0\r\n\r\n"
    : body;
  await conn.write(encoder.encode(head + payload));
}

/**
 * A fake engine. Containers: `missing` (404), `stopped` (409), anything else runs commands:
 * `echo-stdin` (its whole input back on stdout once the input ends), `split` (stdout and stderr
 * frames cut across writes), `exit N`, `hang` (runs until the client goes); a command line with
 * `never-starts` in it gets no process (pid 0, exit 126: the runtime could not start it).
 * Containers and volumes can be started, removed and created (`missing` is never there).
 */
async function fakeEngine() {
  const dir = await tempDir("fake-engine-");
  const socket = `${dir.path}/docker.sock`;
  const listener = Deno.listen({ transport: "unix", path: socket });
  const execs = new Map<string, ExecRecord & { exitCode: number; pid?: number }>();
  const requests: string[] = [];
  const serving = (async () => {
    for await (const conn of listener) {
      void handle(conn).catch(() => {}).finally(() => {
        try {
          conn.close();
        } catch {
          // Closed already.
        }
      });
    }
  })();
  async function handle(conn: Deno.UnixConn): Promise<void> {
    const request = await readRequest(conn);
    if (!request) return;
    requests.push(`${request.method} ${request.path}`);
    let match: RegExpExecArray | null;
    if ((match = /^\/containers\/([^/]+)\/exec$/.exec(request.path)) && request.method === "POST") {
      if (match[1] === "missing") {
        return await respond(conn, 404, `{"message":"No such container: missing"}`);
      }
      if (match[1] === "stopped") {
        return await respond(conn, 409, `{"message":"Container 0123abcd is not running"}`);
      }
      const id = `exec${execs.size + 1}`;
      execs.set(id, {
        container: match[1],
        body: JSON.parse(request.body),
        inputEnded: false,
        clientGone: false,
        exitCode: 0,
      });
      return await respond(conn, 201, JSON.stringify({ Id: id }));
    }
    if ((match = /^\/exec\/([^/]+)\/start$/.exec(request.path))) {
      const exec = execs.get(match[1])!;
      await conn.write(
        encoder.encode(
          "HTTP/1.1 101 UPGRADED\r\nContent-Type: application/vnd.docker.raw-stream\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n",
        ),
      );
      const [command, arg] = exec.body.Cmd;
      if (exec.body.Cmd.includes("never-starts")) {
        exec.exitCode = 126;
        exec.pid = 0;
        await conn.write(frame(2, "OCI runtime exec failed: exec failed\n"));
      } else if (command === "echo-stdin") {
        const chunks: Uint8Array[] = [request.rest];
        const buffer = new Uint8Array(65536);
        while (true) {
          const n = await conn.read(buffer);
          if (n === null) break;
          chunks.push(buffer.slice(0, n));
        }
        exec.inputEnded = true;
        await conn.write(frame(1, chunks.map((c) => decoder.decode(c)).join("")));
      } else if (command === "split") {
        const bytes = new Uint8Array([
          ...frame(1, "out one\nout "),
          ...frame(2, "err line\n"),
          ...frame(1, "two\n"),
        ]);
        for (let at = 0; at < bytes.byteLength; at += 3) {
          await conn.write(bytes.subarray(at, at + 3));
          await new Promise((resolve) => setTimeout(resolve, 1));
        }
      } else if (command === "exit") {
        exec.exitCode = Number(arg);
        await conn.write(frame(2, `exiting ${arg}\n`));
      } else if (command === "hang") {
        await conn.write(frame(1, "started\n"));
        const buffer = new Uint8Array(1024);
        while (await conn.read(buffer).catch(() => null) !== null) {
          // Until the client goes.
        }
        exec.clientGone = true;
      }
      return;
    }
    if ((match = /^\/exec\/([^/]+)\/json$/.exec(request.path))) {
      const exec = execs.get(match[1])!;
      return await respond(
        conn,
        200,
        JSON.stringify({ Running: false, ExitCode: exec.exitCode, Pid: exec.pid ?? 4242 }),
      );
    }
    const absent = () => respond(conn, 404, `{"message":"No such container: missing"}`);
    if (request.path === "/_ping") return await respond(conn, 200, "OK");
    if ((match = /^\/containers\/([^/]+)\/start$/.exec(request.path))) {
      return match[1] === "missing" ? await absent() : await respond(conn, 204, "");
    }
    if ((match = /^\/containers\/([^/?]+)\?/.exec(request.path)) && request.method === "DELETE") {
      return match[1] === "missing" ? await absent() : await respond(conn, 204, "");
    }
    if (request.path === "/volumes/create" && request.method === "POST") {
      const body = JSON.parse(request.body) as { Name: string; DriverOpts: Record<string, string> };
      if (body.DriverOpts.size) {
        return await respond(conn, 500, `{"message":"quota size requested but no quota support"}`);
      }
      return await respond(conn, 201, JSON.stringify({ Name: body.Name }));
    }
    if ((match = /^\/volumes\/([^/]+)$/.exec(request.path)) && request.method === "DELETE") {
      return match[1] === "missing"
        ? await respond(conn, 404, `{"message":"get missing: no such volume"}`)
        : await respond(conn, 204, "");
    }
    if ((match = /^\/containers\/([^/]+)\/json$/.exec(request.path))) {
      if (match[1] === "missing") {
        return await respond(conn, 404, `{"message":"No such container: missing"}`);
      }
      return await respond(
        conn,
        200,
        JSON.stringify({ Id: "c0ffee", Name: `/${match[1]}`, State: { Running: true } }),
        true,
      );
    }
    if ((match = /^\/volumes\/([^/]+)$/.exec(request.path))) {
      return await respond(
        conn,
        200,
        JSON.stringify({ Name: match[1], Options: { size: "1024" } }),
      );
    }
    if ((match = /^\/images\/(.+)\/json$/.exec(request.path))) {
      if (match[1].startsWith("missing")) {
        return await respond(conn, 404, `{"message":"No such image: missing:1"}`);
      }
      return await respond(
        conn,
        200,
        JSON.stringify({ Id: "sha256:abc", Config: { Labels: { a: "b" } } }),
      );
    }
    await respond(conn, 404, `{"message":"page not found"}`);
  }
  return {
    socket,
    execs,
    requests,
    async [Symbol.asyncDispose]() {
      listener.close();
      await serving.catch(() => {});
      await dir[Symbol.asyncDispose]();
    },
  };
}

function apiExec(
  socket: string,
  args: string[],
  options: ConstructorParameters<typeof EngineExec>[3] = {},
) {
  const request = execRequestOf(args, options.env);
  assert.ok(request, `not an API form: ${args.join(" ")}`);
  return new EngineExec(socket, ["docker", ...args], request, options, () => {
    throw new Error("the fallback was used");
  });
}

Deno.test("execRequestOf() reads the exec forms the tool uses, and leaves every other form to the CLI", () => {
  const request = execRequestOf(
    [
      "exec",
      "--interactive",
      "--user",
      "10001:10001",
      "--workdir",
      "/w",
      "--env",
      "A",
      "--env",
      "B=literal",
      "--env",
      "UNSET_ANYWHERE",
      "box",
      "sandbox-exec",
      "id",
      "cat",
    ],
    { A: "from the client" },
  );
  assert.deepEqual(request, {
    container: "box",
    cmd: ["sandbox-exec", "id", "cat"],
    user: "10001:10001",
    workdir: "/w",
    // As the CLI: a name without a value anywhere is left out.
    env: ["A=from the client", "B=literal"],
    interactive: true,
  });
  for (
    const args of [
      ["exec", "--tty", "box", "true"],
      ["exec", "-i", "box", "true"],
      ["exec", "--privileged", "box", "true"],
      ["exec", "box"],
      ["exec", "--user"],
      ["exec", "../etc", "true"],
      ["exec", "--env", "=x", "box", "true"],
      ["run", "box", "true"],
    ]
  ) {
    assert.equal(execRequestOf(args), undefined, args.join(" "));
  }
});

Deno.test("an exec through the engine streams stdout, passes stderr lines on, and reports the command's exit code", async () => {
  await using engine = await fakeEngine();
  const lines: string[] = [];
  const child = apiExec(engine.socket, ["exec", "box", "split"], {
    onStderrLine: (line) => lines.push(line),
  });
  const out: string[] = [];
  for await (const line of child.lines()) out.push(line);
  const outcome = await child.finished;
  assert.deepEqual(out, ["out one", "out two"]);
  assert.deepEqual(lines, ["err line"]);
  assert.equal(outcome.exitCode, 0);
  assert.equal(outcome.stderrTail.trim(), "err line");

  const failing = apiExec(engine.socket, ["exec", "box", "exit", "3"]);
  await new Response(failing.stdout).text();
  const failed = await failing.finished;
  assert.equal(failed.exitCode, 3);
  assert.match(failed.stderrTail, /exiting 3/);
});

Deno.test("an exec's input reaches the command, and its end reaches it too (the command sees end of input)", async () => {
  await using engine = await fakeEngine();
  let controller!: ReadableStreamDefaultController<Uint8Array>;
  const stdin = new ReadableStream<Uint8Array>({ start: (c) => void (controller = c) });
  const child = apiExec(engine.socket, ["exec", "--interactive", "box", "echo-stdin"], { stdin });
  controller.enqueue(encoder.encode("first "));
  controller.enqueue(encoder.encode("second\n"));
  controller.close();
  const [text, outcome] = await Promise.all([new Response(child.stdout).text(), child.finished]);
  assert.equal(text, "first second\n");
  assert.equal(outcome.exitCode, 0);
  assert.equal([...engine.execs.values()][0].inputEnded, true);
  assert.equal([...engine.execs.values()][0].body.AttachStdin, true);
});

Deno.test("an exec's variables travel in the request, taken by name from the client's environment", async () => {
  await using engine = await fakeEngine();
  const child = apiExec(engine.socket, [
    "exec",
    "--user",
    "10001:10001",
    "--env",
    "SANDBOX_EXEC_ENV_TOKEN",
    "box",
    "exit",
    "0",
  ], {
    env: { SANDBOX_EXEC_ENV_TOKEN: "secret-token-value" },
  });
  await new Response(child.stdout).text();
  await child.finished;
  const [exec] = engine.execs.values();
  assert.deepEqual(exec.body.Env, ["SANDBOX_EXEC_ENV_TOKEN=secret-token-value"]);
  assert.equal(exec.body.User, "10001:10001");
  assert.deepEqual(exec.body.Cmd, ["exit", "0"]);
});

Deno.test("an exec in a container that is missing or stopped fails with a typed failure (not-found, not-running) and the engine's message", async () => {
  await using engine = await fakeEngine();
  const missing = apiExec(engine.socket, ["exec", "missing", "true"]);
  await new Response(missing.stdout).text();
  const gone = await missing.finished;
  assert.equal(gone.exitCode, 1);
  assert.equal(gone.failure?.kind, "not-found");
  assert.equal(gone.stderrTail.trim(), "No such container: missing");
  const stopped = apiExec(engine.socket, ["exec", "stopped", "true"]);
  await new Response(stopped.stdout).text();
  const down = await stopped.finished;
  assert.equal(down.exitCode, 1);
  assert.equal(down.failure?.kind, "not-running");
  assert.equal(down.failure?.engineMessage, "Container 0123abcd is not running");
});

Deno.test("an exec whose process never started is the engine's failure (exec-failed); a command's own exit 126 is its result", async () => {
  await using engine = await fakeEngine();
  const never = apiExec(engine.socket, ["exec", "box", "sh", "never-starts"]);
  await new Response(never.stdout).text();
  const failed = await never.finished;
  assert.equal(failed.exitCode, 126);
  assert.equal(failed.failure?.kind, "exec-failed");
  const own = apiExec(engine.socket, ["exec", "box", "exit", "126"]);
  await new Response(own.stdout).text();
  const ran = await own.finished;
  assert.equal(ran.exitCode, 126);
  assert.equal(ran.failure, undefined);
});

Deno.test("kill() ends the client's side at once (exit 143, as the CLI stopped by SIGTERM), and a deadline does too", async () => {
  await using engine = await fakeEngine();
  const child = apiExec(engine.socket, ["exec", "box", "hang"]);
  const reader = child.lines();
  assert.equal((await reader.next()).value, "started");
  child.kill();
  const outcome = await child.finished;
  assert.equal(outcome.exitCode, 143);
  assert.equal(outcome.signal, "SIGTERM");
  assert.equal((await reader.next()).done, true);

  const timed = apiExec(engine.socket, ["exec", "box", "hang"], { timeoutMs: 50 });
  await new Response(timed.stdout).text();
  const late = await timed.finished;
  assert.equal(late.timedOut, true);
  assert.equal(late.exitCode, 143);
  // The fake saw its client go in both cases.
  for (let i = 0; i < 100 && [...engine.execs.values()].some((e) => !e.clientGone); i++) {
    await new Promise((r) => setTimeout(r, 10));
  }
  assert.ok([...engine.execs.values()].every((e) => e.clientGone));
});

Deno.test("an exec whose engine socket cannot be reached runs the CLI instead, with the same input", async () => {
  await using dir = await tempDir();
  const request = execRequestOf(["exec", "--interactive", "box", "cat"])!;
  const child = new EngineExec(
    `${dir.path}/no-engine.sock`,
    ["docker", "exec", "--interactive", "box", "cat"],
    request,
    { stdin: "from the caller" },
    () =>
      // The CLI stand-in: reads its input as the real client would.
      spawn(["sh", "-c", "printf 'cli: '; cat"], { stdin: "from the caller" }),
  );
  const [text, outcome] = await Promise.all([new Response(child.stdout).text(), child.finished]);
  assert.equal(text, "cli: from the caller");
  assert.equal(outcome.exitCode, 0);
});

/** Run `fn` with the environment changed (and the engine decision made again), then restore both. */
async function withEngineEnv(
  changes: Record<string, string | undefined>,
  fn: () => Promise<void> | void,
): Promise<void> {
  try {
    await withEnv(changes, async () => {
      resetEngineSocket();
      await fn();
    });
  } finally {
    resetEngineSocket();
  }
}

/** A directory whose `docker` is a program (a copy of `true`: any binary will do), or a script. */
async function dockerOnPath(kind: "program" | "script") {
  const dir = await tempDir("docker-bin-");
  if (kind === "program") await Deno.copyFile("/bin/true", `${dir.path}/docker`);
  else await Deno.writeTextFile(`${dir.path}/docker`, '#!/bin/sh\nexec podman "$@"\n');
  await Deno.chmod(`${dir.path}/docker`, 0o755);
  return dir;
}

Deno.test("the engine's socket is used only where the CLI would reach that same engine", async () => {
  await using program = await dockerOnPath("program");
  await using script = await dockerOnPath("script");
  await using config = await tempDir("docker-config-");
  const path = `${program.path}:${Deno.env.get("PATH")}`;
  const base = {
    PATH: path,
    DOCKER_HOST: undefined,
    DOCKER_CONTEXT: undefined,
    DOCKER_CONFIG: config.path,
    DOCKER_API_VERSION: undefined,
    SANDBOX_DOCKER_API: undefined,
  };
  await withEngineEnv(base, () => assert.equal(engineSocket(), "/var/run/docker.sock"));
  await withEngineEnv(
    { ...base, DOCKER_HOST: "unix:///run/user/1000/docker.sock" },
    () => assert.equal(engineSocket(), "/run/user/1000/docker.sock"),
  );
  // Other transports, contexts, a pinned API version, a wrapper script, or told not to: the CLI.
  await withEngineEnv(
    { ...base, DOCKER_HOST: "tcp://10.0.0.1:2376" },
    () => assert.equal(engineSocket(), undefined),
  );
  await withEngineEnv(
    { ...base, DOCKER_HOST: "ssh://me@box" },
    () => assert.equal(engineSocket(), undefined),
  );
  await withEngineEnv(
    { ...base, DOCKER_HOST: "npipe:////./pipe/docker_engine" },
    () => assert.equal(engineSocket(), undefined),
  );
  await withEngineEnv(
    { ...base, DOCKER_CONTEXT: "remote" },
    () => assert.equal(engineSocket(), undefined),
  );
  await withEngineEnv(
    { ...base, DOCKER_CONTEXT: "default" },
    () => assert.equal(engineSocket(), "/var/run/docker.sock"),
  );
  await withEngineEnv(
    { ...base, DOCKER_API_VERSION: "1.40" },
    () => assert.equal(engineSocket(), undefined),
  );
  await withEngineEnv(
    { ...base, SANDBOX_DOCKER_API: "0" },
    () => assert.equal(engineSocket(), undefined),
  );
  await withEngineEnv(
    { ...base, PATH: `${script.path}:${path}` },
    () => assert.equal(engineSocket(), undefined),
  );
  await Deno.writeTextFile(
    `${config.path}/config.json`,
    JSON.stringify({ currentContext: "colima" }),
  );
  await withEngineEnv(base, () => assert.equal(engineSocket(), undefined));
  await Deno.writeTextFile(
    `${config.path}/config.json`,
    JSON.stringify({ currentContext: "default", auths: {} }),
  );
  await withEngineEnv(base, () => assert.equal(engineSocket(), "/var/run/docker.sock"));
});

/** `fn` with `docker` a program on PATH and DOCKER_HOST the fake engine: the API path. */
async function onFakeEngine(
  engine: { socket: string },
  fn: (programDir: string) => Promise<void>,
): Promise<void> {
  // `docker` is `true` here: a call that went to the CLI would print nothing.
  await using program = await dockerOnPath("program");
  await using config = await tempDir("docker-config-");
  await withEngineEnv({
    PATH: `${program.path}:${Deno.env.get("PATH")}`,
    DOCKER_HOST: `unix://${engine.socket}`,
    DOCKER_CONTEXT: undefined,
    DOCKER_CONFIG: config.path,
    SANDBOX_DOCKER_API: undefined,
  }, () => fn(program.path));
}

async function rejectsWith(promise: Promise<unknown>, kind: EngineErrorKind): Promise<void> {
  await assert.rejects(promise, (error) => {
    assert.ok(error instanceof EngineError, String(error));
    assert.equal(error.kind, kind);
    return true;
  });
}

Deno.test("the engine port answers through the API with typed results, and typed errors carrying the engine's message", async () => {
  await using engine = await fakeEngine();
  await onFakeEngine(engine, async () => {
    const port = dockerEngine();
    assert.equal((await port.inspectContainer("box")).Name, "/box");
    await rejectsWith(port.inspectContainer("missing"), "not-found");
    assert.deepEqual((await port.inspectVolume("v")).Options, { size: "1024" });
    assert.equal((await port.inspectImage("sandbox-runtime:1")).Id, "sha256:abc");
    await rejectsWith(port.inspectImage("missing:1"), "image-missing");
    await port.startContainer("box");
    await rejectsWith(port.startContainer("missing"), "not-found");
    await port.removeContainer("box", { volumes: true });
    await rejectsWith(port.removeContainer("missing"), "not-found");
    await port.removeVolume("v");
    await rejectsWith(port.removeVolume("missing"), "not-found");
    await port.createVolume("v", { a: "b" });
    await assert.rejects(port.createVolume("v", {}, { size: "1" }), (error) => {
      assert.ok(error instanceof EngineError);
      assert.equal(error.kind, "refused");
      assert.equal(error.engineMessage, "quota size requested but no quota support");
      return true;
    });
    const child = port.exec({ container: "box", cmd: ["echo-stdin"], env: [], interactive: true }, {
      stdin: "piped\n",
    });
    const [out, outcome] = await Promise.all([new Response(child.stdout).text(), child.finished]);
    assert.equal(out, "piped\n");
    assert.equal(outcome.exitCode, 0);
  });
  assert.ok(engine.requests.includes("DELETE /containers/box?force=1&v=1"), engine.requests.join());
});

Deno.test("a sandbox exec the engine cannot start is exec_failed; in a missing container container_not_found", async () => {
  await using engine = await fakeEngine();
  const parsed = parseConfig("profiles: {work: {}}", undefined, () => undefined);
  if (parsed.kind !== "ok") throw new Error("config");
  const profile = resolveProfile(parsed.config, "work");
  await onFakeEngine(engine, async () => {
    const provider = new DockerSandboxProvider(profile);
    await assert.rejects(
      provider.exec(["never-starts"]),
      (e: SandboxError) => e.code === "exec_failed",
    );
    const gone = new DockerSandboxProvider(profile, { existing: "missing" });
    await assert.rejects(
      gone.exec(["true"]),
      (e: SandboxError) => e.code === "container_not_found",
    );
  });
});

Deno.test("DockerCli makes an exec through the engine when it may, and leaves it to the CLI when it names another program or changes the client's environment", async () => {
  await using engine = await fakeEngine();
  await onFakeEngine(engine, async (programDir) => {
    const docker = new DockerCli();
    const echoed = await docker.run(["exec", "--interactive", "box", "echo-stdin"], {
      stdin: "piped\n",
    });
    assert.equal(echoed.stdout, "piped\n");
    const named = await new DockerCli(`${programDir}/docker`).run(["exec", "box", "echo-stdin"]);
    assert.equal(named.stdout, "");
    const own = await docker.run(["exec", "box", "echo-stdin"], {
      env: { DOCKER_HOST: "tcp://elsewhere:2375" },
    });
    assert.equal(own.stdout, "");
  });
  assert.equal(engine.requests.filter((r) => r.startsWith("POST /containers")).length, 1);
});

Deno.test("the engine port over the CLI types a failure by asking again in a structured form, never by reading stderr", async () => {
  // An engine with container `box` and volume `v`; every failure says only "failed" on stderr.
  await using docker = await fakeDocker(`
case "$1 $2" in
  "version --format") echo 20.10 ;;
  "ps --all") echo "0123abcd box" ;;
  "volume ls") echo v ;;
  "container inspect"|"volume inspect"|"image inspect") echo failed >&2; exit 1 ;;
  "rm --force") [ "\${@: -1}" = box ] && echo box ;;
  "start box") echo failed >&2; exit 1 ;;
esac`);
  const port = dockerEngine(docker.program);
  await rejectsWith(port.inspectContainer("gone"), "not-found");
  await rejectsWith(port.inspectContainer("box"), "refused");
  await rejectsWith(port.inspectVolume("gone"), "not-found");
  await rejectsWith(port.inspectImage("img:1"), "image-missing");
  await port.removeContainer("box");
  // docker 20.10: `rm --force` of a missing container exits 0 and prints no name.
  await rejectsWith(port.removeContainer("gone"), "not-found");
  await rejectsWith(port.startContainer("box"), "refused");

  await using down = await fakeDocker(`echo "failed" >&2; exit 1`);
  await assert.rejects(
    dockerEngine(down.program).inspectContainer("box"),
    (e: SandboxError) => e.code === "daemon_down",
  );
});
