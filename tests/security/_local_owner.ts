/**
 * The owner of a mode-local sandbox, for the lifeline test (local_mode_test.ts): it acquires one,
 * leaves a `setsid` survivor in it (`sleep 4733`), says `ready <holder pid>`, and waits to be killed.
 */
import { sandboxLifecycle } from "../../lib/sandbox/providers.ts";
import type { LocalSandbox } from "../../lib/sandbox/local/local_sandbox.ts";
import { profileFrom } from "../_helpers.ts";

const profile = profileFrom("profiles:\n  owner:\n    sandbox: {mode: local}\n", "owner");
const sandbox = await (await sandboxLifecycle(profile)).acquire({ runId: "owner" });
await sandbox.provider.exec([
  "sh",
  "-c",
  "setsid sh -c 'exec sleep 4733' </dev/null >/dev/null 2>&1 &",
]);
console.log(`ready ${(sandbox.provider as LocalSandbox).holderPid}`);
await new Promise(() => {});
