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
  inspectRequestOf,
  resetEngineSocket,
} from "../../lib/sandbox/engine_api.ts";
import { DockerCli, isNoSuchObject } from "../../lib/sandbox/docker.ts";
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
 * frames cut across writes), `exit N`, `hang` (runs until the client goes).
 */
async function fakeEngine() {
  const dir = await tempDir("fake-engine-");
  const socket = `${dir.path}/docker.sock`;
  const listener = Deno.listen({ transport: "unix", path: socket });
  const execs = new Map<string, ExecRecord & { exitCode: number }>();
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
      if (command === "echo-stdin") {
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
      return await respond(conn, 200, JSON.stringify({ Running: false, ExitCode: exec.exitCode }));
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

Deno.test("inspectRequestOf() answers only the inspect forms whose output it can make exactly", () => {
  assert.equal(inspectRequestOf(["container", "inspect", "box"])?.path, "/containers/box/json");
  assert.equal(
    inspectRequestOf(["volume", "inspect", "--format", "{{json .Options}}", "v"])?.path,
    "/volumes/v",
  );
  assert.equal(
    inspectRequestOf(["image", "inspect", "--format", "{{.Id}}", "sandbox-runtime:1"])?.path,
    "/images/sandbox-runtime%3A1/json",
  );
  assert.equal(
    inspectRequestOf(["image", "inspect", "--format", "{{.Id}}", "registry.local/team/img:2"])
      ?.path,
    "/images/registry.local/team/img%3A2/json",
  );
  for (
    const args of [
      ["container", "inspect", "a", "b"],
      ["container", "inspect", "--format", "{{.Id}}", "box"],
      ["volume", "inspect", "--format", "{{.Name}}", "v"],
      ["image", "inspect", "img"],
      ["network", "inspect", "n"],
      ["container", "ls"],
    ]
  ) {
    assert.equal(inspectRequestOf(args), undefined, args.join(" "));
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

Deno.test("an exec in a container that is missing or stopped fails as the CLI says it (exit 1, the daemon's message)", async () => {
  await using engine = await fakeEngine();
  const missing = apiExec(engine.socket, ["exec", "missing", "true"]);
  await new Response(missing.stdout).text();
  const gone = await missing.finished;
  assert.equal(gone.exitCode, 1);
  assert.ok(isNoSuchObject(gone.stderrTail), gone.stderrTail);
  const stopped = apiExec(engine.socket, ["exec", "stopped", "true"]);
  await new Response(stopped.stdout).text();
  const down = await stopped.finished;
  assert.equal(down.exitCode, 1);
  assert.match(down.stderrTail, /^Error response from daemon: Container 0123abcd is not running/);
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

Deno.test("DockerCli answers inspects and execs through the engine when it may, as the CLI would have printed them", async () => {
  await using engine = await fakeEngine();
  // `docker` is `true` here: a call that went to the CLI would print nothing.
  await using program = await dockerOnPath("program");
  await using config = await tempDir("docker-config-");
  await withEngineEnv({
    PATH: `${program.path}:${Deno.env.get("PATH")}`,
    DOCKER_HOST: `unix://${engine.socket}`,
    DOCKER_CONTEXT: undefined,
    DOCKER_CONFIG: config.path,
    SANDBOX_DOCKER_API: undefined,
  }, async () => {
    const docker = new DockerCli();
    const container = await docker.run(["container", "inspect", "box"]);
    assert.equal(container.exitCode, 0);
    assert.equal(JSON.parse(container.stdout)[0].Name, "/box");
    const missing = await docker.run(["container", "inspect", "missing"]);
    assert.equal(missing.exitCode, 1);
    assert.ok(isNoSuchObject(missing.stderr), missing.stderr);
    const quota = await docker.run(["volume", "inspect", "--format", "{{json .Options}}", "v"]);
    assert.deepEqual(JSON.parse(quota.stdout), { size: "1024" });
    const image = await docker.run([
      "image",
      "inspect",
      "--format",
      "{{.Id}}",
      "sandbox-runtime:1",
    ]);
    assert.equal(image.stdout, "sha256:abc\n");
    const absent = await docker.run(["image", "inspect", "--format", "{{.Id}}", "missing:1"]);
    assert.equal(absent.exitCode, 1);
    assert.match(absent.stderr, /No such image/);
    const echoed = await docker.run(["exec", "--interactive", "box", "echo-stdin"], {
      stdin: "piped\n",
    });
    assert.equal(echoed.stdout, "piped\n");
    // A call that names another program, or changes what the client reads, goes to the CLI.
    const named = await new DockerCli(`${program.path}/docker`).run([
      "container",
      "inspect",
      "box",
    ]);
    assert.equal(named.stdout, "");
    const own = await docker.run(["container", "inspect", "box"], {
      env: { DOCKER_HOST: "tcp://elsewhere:2375" },
    });
    assert.equal(own.stdout, "");
  });
  assert.deepEqual(engine.requests.filter((r) => r.startsWith("GET /containers")), [
    "GET /containers/box/json",
    "GET /containers/missing/json",
  ]);
});
