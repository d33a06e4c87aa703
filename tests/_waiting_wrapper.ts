/**
 * The container's waiting command wrapper (lib/sandbox/waiting_exec.ts), as tests see it: the
 * host's record of it and its pid, read as root from outside; and, for unit tests, a claimed and
 * connected one whose other ends (the wrapper's side) the test holds.
 */
import assert from "node:assert/strict";
import { run } from "../lib/process.ts";
import { PROXY_MOUNT_PATH } from "../lib/sandbox/proxy_mount.ts";
import type { WaitingConnections } from "../lib/sandbox/waiting_exec.ts";

export interface Waiting {
  id: string;
  dir: string;
  key: string;
  pid: number;
}

/** The container's waiting wrapper; undefined when none is recorded (one recorded must be running). */
export async function waitingWrapper(container: string): Promise<Waiting | undefined> {
  // The host's directory mounted there (whichever state directory made it), and the record beside it.
  const inspected = await run(["docker", "inspect", "--format", "{{json .Mounts}}", container]);
  assert.equal(inspected.exitCode, 0, inspected.stderr);
  const mounts = JSON.parse(inspected.stdout) as { Source: string; Destination: string }[];
  const source = mounts.find((mount) => mount.Destination === PROXY_MOUNT_PATH)?.Source;
  assert.ok(source, `${container} has no mount at ${PROXY_MOUNT_PATH}`);
  let record: { id: string; dir: string; key: string };
  try {
    record = JSON.parse(await Deno.readTextFile(`${source}.waiting-exec.json`));
  } catch {
    return undefined;
  }
  const ps = await run(["docker", "exec", "--user", "0", container, "ps", "-eo", "pid=,args="]);
  const line = ps.stdout.split("\n").find((line) => line.includes(`sandbox-exec --waiting ${record.id} `));
  assert.ok(line, `no waiting wrapper ${record.id} in:\n${ps.stdout}`);
  return { ...record, pid: Number(line.trim().split(" ")[0]) };
}

/**
 * A claimed, connected waiting wrapper whose other ends (the wrapper's side) this test holds;
 * `using` it closes every connection at the end of the scope.
 */
export async function connectedWrapper(
  root: string,
): Promise<{ conns: WaitingConnections; wrapperControl: Deno.UnixConn; wrapperIo: Deno.UnixConn; wrapperStderr: Deno.UnixConn } & Disposable> {
  const mountSource = `${root}/mount`;
  const hostDir = `${mountSource}/e1234567`;
  await Deno.mkdir(hostDir, { recursive: true });
  const listener = Deno.listen({ transport: "unix", path: `${hostDir}/job.sock` });
  const pairs: [Deno.UnixConn, Deno.UnixConn][] = [];
  for (let i = 0; i < 3; i++) {
    const [wrapperSide, hostSide] = await Promise.all([Deno.connect({ transport: "unix", path: `${hostDir}/job.sock` }), listener.accept()]);
    pairs.push([wrapperSide, hostSide]);
  }
  listener.close();
  const record = { id: "waiting-test", dir: "e1234567", key: "ab".repeat(32) };
  const conns: WaitingConnections = {
    id: record.id,
    record,
    mountSource,
    hostDir,
    control: pairs[0][1],
    io: pairs[1][1],
    stderr: pairs[2][1],
  };
  const close = () => {
    for (const pair of pairs) {
      for (const conn of pair) {
        try {
          conn.close();
        } catch {
          // Closed already.
        }
      }
    }
  };
  return { conns, wrapperControl: pairs[0][0], wrapperIo: pairs[1][0], wrapperStderr: pairs[2][0], [Symbol.dispose]: close };
}
