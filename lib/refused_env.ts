/**
 * Environment variables a configuration may not set in a sandbox: a devcontainer.json's
 * `containerEnv` and `remoteEnv`, and a profile's `sandbox.environment.set` and `passthrough`.
 *
 * The rule: a name is refused when it changes how the dynamic loader, a shell, git, or an
 * interpreter starts — a library loaded into every process, options or modules injected into
 * every interpreter, a startup file, git configuration or helper programs. The container's
 * environment reaches the processes the sandbox itself runs there (its wrappers are perl, its
 * worker deno, its repository work git and sh, its agent CLIs native or bun-built programs), so
 * such a name would put the repository's code into them: `PERL5OPT=-d` with `PERL5DB` ran code
 * in every wrapper, the relay's among them. The startup switches of other common interpreters
 * (`PYTHONSTARTUP`, `RUBYOPT`, `JAVA_TOOL_OPTIONS`) are refused too: they inject code into every
 * program in that language the agent starts, which it never asked for.
 *
 * Left alone on purpose: search paths for a project's own code that no process of the sandbox
 * reads (`PYTHONPATH`, `RUBYLIB`, `GEM_PATH`, `CLASSPATH`) — they are how a devcontainer points
 * its tools at the project — `NODE_ENV` (a convention libraries read, not node), and `PATH`.
 */

/** One refused name or family of names (`*` at the end: every name with that prefix). */
export interface RefusedEnv {
  names: readonly string[];
  /** What the variable changes, for the warning. */
  changes: string;
  /** Names of the family that are allowed all the same. */
  except?: readonly string[];
}

export const REFUSED_ENV: readonly RefusedEnv[] = [
  { names: ["LD_*"], changes: "the dynamic loader (libraries loaded into every process)" },
  {
    names: ["GCONV_PATH", "GLIBC_TUNABLES", "MALLOC_*", "LOCPATH", "NLSPATH"],
    changes: "the C library (modules it loads, allocator and tunables)",
  },
  { names: ["PERL*"], changes: "how perl starts (options, modules, debugger, I/O layers)" },
  {
    names: ["NODE_*"],
    changes: "how node starts (options, modules, certificates)",
    except: ["NODE_ENV"],
  },
  { names: ["BUN_OPTIONS"], changes: "how bun-built programs start" },
  { names: ["DENO_*"], changes: "how deno starts (its cache, certificates, flags)" },
  {
    names: [
      "BASH_ENV",
      "ENV",
      "BASH_FUNC_*",
      "SHELLOPTS",
      "BASHOPTS",
      "PS4",
      "PROMPT_COMMAND",
      "CDPATH",
      "GLOBIGNORE",
      "IFS",
    ],
    changes: "how shells start (startup files, functions, options)",
  },
  { names: ["GIT_*", "XDG_CONFIG_HOME"], changes: "git's configuration and the programs it runs" },
  { names: ["PYTHONSTARTUP", "PYTHONINSPECT"], changes: "how python starts" },
  { names: ["RUBYOPT"], changes: "how ruby starts" },
  { names: ["JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS"], changes: "how java starts" },
];

function matches(pattern: string, name: string): boolean {
  return pattern.endsWith("*") ? name.startsWith(pattern.slice(0, -1)) : name === pattern;
}

/** What setting `name` would change, when it is refused; `undefined` when it may be set. */
export function refusedEnvReason(name: string): string | undefined {
  for (const rule of REFUSED_ENV) {
    if (rule.except?.includes(name)) continue;
    if (rule.names.some((pattern) => matches(pattern, name))) return `it changes ${rule.changes}`;
  }
  return undefined;
}

/**
 * `env` without its refused names, and one warning per name refused: `where(name)` says where the
 * name was set (`devcontainer.json: "containerEnv.PERL5OPT"`).
 */
export function withoutRefusedEnv(
  env: Readonly<Record<string, string>>,
  where: (name: string) => string,
): { env: Record<string, string>; warnings: string[] } {
  const kept: Record<string, string> = {};
  const warnings: string[] = [];
  for (const [name, value] of Object.entries(env)) {
    const reason = refusedEnvReason(name);
    if (reason) warnings.push(`${where(name)} is refused and not set: ${reason}`);
    else kept[name] = value;
  }
  return { env: kept, warnings };
}
