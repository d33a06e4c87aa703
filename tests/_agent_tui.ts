/**
 * For the tests that drive an agent CLI's real TUI in a sandbox under tmux: look for a secret in
 * the live sandbox, type a prompt until the TUI has taken it, read the repository it worked on.
 */
export { git } from "./_git.ts";
import { git } from "./_git.ts";
import { run } from "../lib/process.ts";
import { docker } from "./_helpers.ts";
import type { Tmux } from "./_tmux.ts";

/** A repository at `path` with one commit on main. */
export async function createRepo(path: string): Promise<string> {
  await Deno.mkdir(path);
  await git(path, "init", "-q", "-b", "main");
  await Deno.writeTextFile(`${path}/README`, "hello\n");
  await git(path, "add", "-A");
  await git(path, "-c", "user.name=T", "-c", "user.email=t@example.com", "commit", "-qm", "init");
  return path;
}

/** `script` in the container as the sandbox user, `stdin` on its stdin (secrets never on argv). */
async function inContainer(container: string, script: string, stdin: string): Promise<string> {
  const result = await run(
    ["docker", "exec", "--interactive", "--user", "10001:10001", container, "sh", "-c", script],
    { stdin },
  );
  return result.stdout;
}

/** Where `needle` is in the live sandbox: processes, readable files, `docker inspect`. */
export async function whereIs(container: string, needle: string): Promise<string[]> {
  const found: string[] = [];
  const procs = await inContainer(
    container,
    "for p in /proc/[0-9]*; do cat $p/environ $p/cmdline; done 2>/dev/null | grep -cF -f /dev/stdin; true",
    needle,
  );
  if (Number(procs.trim()) > 0) found.push(`${procs.trim()} process environments or command lines`);
  const files = await inContainer(
    container,
    "grep -rlF -f /dev/stdin -- /home/sandbox /tmp /workspace /opt 2>/dev/null; true",
    needle,
  );
  found.push(...files.split("\n").filter(Boolean));
  if ((await docker("container", "inspect", container)).includes(needle)) found.push("inspect");
  return found;
}

/** The running sandbox of `profile` whose name has `-AGENT-` in it. */
export async function agentContainer(profile: string, agent: string): Promise<string | undefined> {
  const names = await docker(
    "ps",
    "--format",
    "{{.Names}}",
    "--filter",
    `label=dev.sandbox.profile=${profile}`,
    "--filter",
    `name=-${agent}-`,
  );
  return names.split("\n").find((name) => name !== "");
}

/**
 * Type `text` into the TUI (whose input line starts with `prompt`), then Enter until `taken` says
 * it was: while the TUI still starts up, an Enter is dropped (the text stays in its prompt).
 */
export async function submit(
  tmux: Tmux,
  text: string,
  taken: () => Promise<boolean>,
  prompt = "❯",
): Promise<void> {
  await tmux.send("-l", text);
  await tmux.waitFor(new RegExp(`${prompt}\\s${text.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&")}`));
  while (true) {
    await tmux.send("Enter");
    for (let polls = 0; polls < 25; polls++) {
      if (await taken()) return;
      await new Promise((resolve) => setTimeout(resolve, 200));
    }
  }
}
