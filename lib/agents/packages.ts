/**
 * The agent CLIs a run can use instead of the built-in worker, and the npm packages they come
 * from, pinned by version and by the registry's integrity hash of each platform's tarball.
 *
 * Both CLIs ship a native binary per platform in a package of its own (the package users install,
 * `@anthropic-ai/claude-code` or `@openai/codex`, only picks one at install time), so the layer
 * needs neither node nor npm: the platform tarball is fetched, checked against the hash below,
 * and its files copied into the image. Updating a pin: `npm view <package>@<version>
 * dist.integrity` for each platform, and check the flags in `launch.ts` against `--help`.
 */

/** Agent CLIs that run from a layer on top of the sandbox image. */
export const AGENT_CLIS = ["claude-code", "codex"] as const;
export type AgentCliName = (typeof AGENT_CLIS)[number];

/** Every agent a run can use: the built-in deepagents worker, or an agent CLI. */
export const AGENTS = ["deepagents", ...AGENT_CLIS] as const;
export type AgentName = (typeof AGENTS)[number];

export const DEFAULT_AGENT: AgentName = "deepagents";

/** Docker's names for the architectures we have binaries for. */
export type Architecture = "amd64" | "arm64";

export interface PlatformTarball {
  /** The npm package (name and version) the tarball belongs to, as `npm view` takes it. */
  spec: string;
  /** The registry path of the tarball, after the registry URL. */
  path: string;
  /** Subresource integrity of the tarball, as the registry publishes it (`dist.integrity`). */
  integrity: string;
  /** The directory inside the tarball that holds the installed files. */
  root: string;
}

export interface AgentPackage {
  agent: AgentCliName;
  /** The package a user would install, for messages. */
  name: string;
  version: string;
  tarballs: Readonly<Record<Architecture, PlatformTarball>>;
  /** The program, relative to the agent's directory in the image. */
  entrypoint: string;
}

/** Where an agent's files live in its layer. */
export function agentDir(agent: AgentCliName): string {
  return `/opt/sandbox/agents/${agent}`;
}

export const AGENT_PACKAGES: Readonly<Record<AgentCliName, AgentPackage>> = {
  "claude-code": {
    agent: "claude-code",
    name: "@anthropic-ai/claude-code",
    version: "2.1.330",
    tarballs: {
      amd64: {
        spec: "@anthropic-ai/claude-code-linux-x64@2.1.330",
        path: "@anthropic-ai/claude-code-linux-x64/-/claude-code-linux-x64-2.1.330.tgz",
        integrity:
          "sha512-9Gn+V7DtJ8M1nztP9CeDVl9g3RtrepI7rOFTyPRRnZe8D6zebIHKmC7OvBauucuAP0X0k85SDN/LPVZyjsGezQ==",
        root: "package",
      },
      arm64: {
        spec: "@anthropic-ai/claude-code-linux-arm64@2.1.330",
        path: "@anthropic-ai/claude-code-linux-arm64/-/claude-code-linux-arm64-2.1.330.tgz",
        integrity:
          "sha512-V4yanAY5EA5UpwwRPtjSfqDbNqAlUJeVn3NYZw2AgmRHjdpSsLtHAzbxRXfkAnbjwTXzE0uedjQxUY02ARPcsA==",
        root: "package",
      },
    },
    entrypoint: "claude",
  },
  codex: {
    agent: "codex",
    name: "@openai/codex",
    version: "0.169.0",
    tarballs: {
      amd64: {
        spec: "@openai/codex@0.169.0-linux-x64",
        path: "@openai/codex/-/codex-0.169.0-linux-x64.tgz",
        integrity:
          "sha512-o05NyAOCDygSPRo1yinzxvkRSdmsZyBD9E7mbpmjRanSfM8lypqWtQgEo4XfNkwhuCR2aFu8mlGOsQGFXVbVww==",
        root: "package/vendor/x86_64-unknown-linux-musl",
      },
      arm64: {
        spec: "@openai/codex@0.169.0-linux-arm64",
        path: "@openai/codex/-/codex-0.169.0-linux-arm64.tgz",
        integrity:
          "sha512-NZ/DaQUpcQmxmqee7Z9uC1rzw3GhSbooawcaTe1LN5Yk+WlinUKGdTXJgClRT/9ogQEEM9TWxYzvxPfj5G/xFg==",
        root: "package/vendor/aarch64-unknown-linux-musl",
      },
    },
    // The native binary itself: the package's `bin/codex.js` only finds and execs it, with node.
    entrypoint: "bin/codex",
  },
};

/** Is `name` an agent CLI (as opposed to the built-in worker)? */
export function isAgentCli(name: string | undefined): name is AgentCliName {
  return (AGENT_CLIS as readonly string[]).includes(name ?? "");
}
