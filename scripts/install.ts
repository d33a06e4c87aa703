/**
 * `deno task install`: put `sandbox` on the PATH.
 *
 * Builds the bundle (scripts/bundle.sh), copies it and its start file to `<prefix>/lib/sandbox/`
 * (`sandbox.js`, `sandbox-start.js`) and writes a small launcher, `<prefix>/bin/sandbox`, that runs
 * the start file with `deno run -A --quiet --no-config` and
 * the unstable flags listed in deno.json (a bundle cannot carry them; without them Deno warns on
 * every run). The bin directory is `$SANDBOX_INSTALL_DIR`, else `~/.local/bin`; `<prefix>` is its
 * parent. Says so when the directory is not on PATH. Run it again to update.
 */
import denoJson from "../deno.json" with { type: "json" };

const root = new URL("..", import.meta.url).pathname.replace(/\/$/, "");
const home = Deno.env.get("HOME") ?? "/root";
const binDir = (Deno.env.get("SANDBOX_INSTALL_DIR") || `${home}/.local/bin`).replace(/\/+$/, "");
const libDir = `${binDir.replace(/\/[^/]*$/, "") || "/"}/lib/sandbox`.replace(/^\/\//, "/");
const say = (line: string) => console.error(`install: ${line}`);

const bundled = await new Deno.Command("bash", {
  args: [`${root}/scripts/bundle.sh`],
  stdout: "inherit",
  stderr: "inherit",
})
  .output();
if (!bundled.success) {
  say("building the bundle failed (see above)");
  Deno.exit(1);
}

await Deno.mkdir(binDir, { recursive: true });
await Deno.mkdir(libDir, { recursive: true });
// Replace by rename, so that a `sandbox` running while it is updated keeps its old file; the
// bundle before the start file that imports it.
for (const file of ["sandbox.js", "sandbox-start.js"]) {
  await Deno.copyFile(`${root}/dist/${file}`, `${libDir}/${file}.${Deno.pid}.tmp`);
  await Deno.rename(`${libDir}/${file}.${Deno.pid}.tmp`, `${libDir}/${file}`);
}
const start = `${libDir}/sandbox-start.js`;

const unstable = ((denoJson as { unstable?: string[] }).unstable ?? []).map((feature) =>
  `--unstable-${feature}`
);
const quote = (text: string) => `'${text.replaceAll("'", `'\\''`)}'`;
const launcher = `${binDir}/sandbox`;
const script = `#!/bin/sh
# sandbox ${denoJson.version}: written by \`deno task install\` in ${root}; run it again to update.
deno_bin="$(command -v deno || echo ${quote(Deno.execPath())})"
exec "$deno_bin" run -A --quiet --no-config ${unstable.join(" ")} ${quote(start)} "$@"
`;
await Deno.writeTextFile(`${launcher}.${Deno.pid}.tmp`, script, { mode: 0o755 });
await Deno.chmod(`${launcher}.${Deno.pid}.tmp`, 0o755);
await Deno.rename(`${launcher}.${Deno.pid}.tmp`, launcher);

say(`installed sandbox ${denoJson.version}: ${launcher} (runs ${start})`);
const onPath = (Deno.env.get("PATH") ?? "").split(":").some((dir) =>
  dir.replace(/\/+$/, "") === binDir
);
if (!onPath) {
  say(
    `${binDir} is not on your PATH: add it, e.g. echo 'export PATH="${binDir}:$PATH"' >> ~/.profile`,
  );
}
