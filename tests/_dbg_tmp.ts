import { sandboxLifecycle } from "../lib/sandbox/providers.ts";
import type { LocalSandbox } from "../lib/sandbox/local/local_sandbox.ts";
import { profileFrom } from "./_helpers.ts";
const profile = profileFrom("profiles:\n  owner:\n    sandbox: {mode: local}\n", "owner");
const sandbox = await (await sandboxLifecycle(profile)).acquire({ runId: "dbg" });
const p = sandbox.provider as LocalSandbox;
const ps = async () =>
  (await p.exec(["sh", "-c", "ps -eo pid,ppid,sid,stat,args | grep -v bwrap"])).stdout;
for (
  const [label, script, opts] of [
    ["normal", "sleep 302 >/dev/null 2>&1 </dev/null & echo done", {}],
    ["timeout, detached fds", "sleep 303 >/dev/null 2>&1 </dev/null & exec sleep 100", {
      timeoutMs: 1500,
    }],
    ["timeout, shared stdout", "sleep 304 & exec sleep 100", { timeoutMs: 1500 }],
  ] as const
) {
  const r = await p.exec(["sh", "-c", script], opts);
  console.log(label, r.exitCode, r.timedOut, r.stderr.trim());
  console.log(await ps());
}
await sandbox.release();
