/**
 * Environment variables for `docker run` and `docker exec` without their values on a command
 * line: `ps` shows every user every process's argv, and an exec's environment carries the session
 * token. `docker ... --env NAME` (no `=`) makes the docker client take the value from its own
 * environment, which only the same user can read; we set it there when spawning the client.
 */

/**
 * An exec's variables travel under this prefix; `sandbox-exec` inside renames them. The prefix
 * keeps them apart from the variables the docker client itself obeys (`DOCKER_HOST`, `HTTP_PROXY`,
 * `HOME`...), which a sandbox's environment routinely holds with values meant for the sandbox.
 */
export const EXEC_ENV_PREFIX = "SANDBOX_EXEC_ENV_";

/** Names the docker CLI reads itself: giving them other values would change where and how it connects. */
const CLIENT_READS =
  /^(DOCKER_\w*|BUILDKIT_\w*|OTEL_\w*|GO\w*|LD_\w*|XDG_\w*|HOME|PATH|TMPDIR|USER|SHELL|SSH_AUTH_SOCK|SSL_CERT_FILE|SSL_CERT_DIR|HTTPS?_PROXY|NO_PROXY|ALL_PROXY)$/i;

export interface EnvByName {
  /** `--env NAME` flags (and, for names the client reads itself, `--env NAME=VALUE`). */
  args: string[];
  /** Variables to set in the docker client's own environment. */
  clientEnv: Record<string, string>;
}

function checkName(name: string): void {
  if (name === "" || name.includes("=") || name.includes("\0")) {
    throw new TypeError(`Invalid environment variable name "${name}"`);
  }
}

/** Variables of one `docker exec` whose command runs under `sandbox-exec`: all by name, renamed inside. */
export function execEnvByName(env: Record<string, string>): EnvByName {
  const args: string[] = [];
  const clientEnv: Record<string, string> = {};
  for (const [name, value] of Object.entries(env)) {
    checkName(name);
    args.push("--env", `${EXEC_ENV_PREFIX}${name}`);
    clientEnv[`${EXEC_ENV_PREFIX}${name}`] = value;
  }
  return { args, clientEnv };
}

/**
 * Variables of a `docker run` (no wrapper to rename them there): by name, except a name the
 * docker client reads itself whose value is not already the client's own — those are literal
 * configuration values (`environment.set`), which validation keeps free of secret names.
 */
export function runEnvByName(
  env: Record<string, string>,
  clientOwn: (name: string) => string | undefined = (name) => Deno.env.get(name),
): EnvByName {
  const args: string[] = [];
  const clientEnv: Record<string, string> = {};
  for (const [name, value] of Object.entries(env)) {
    checkName(name);
    if (!CLIENT_READS.test(name)) {
      args.push("--env", name);
      clientEnv[name] = value;
    } else if (clientOwn(name) === value) {
      args.push("--env", name);
    } else {
      args.push("--env", `${name}=${value}`);
    }
  }
  return { args, clientEnv };
}
