/**
 * The deliberate breaks `deno task mutate` (scripts/mutate.ts) applies, one at a time: each removes
 * or weakens one security defence, and the listed tests must then fail. Add an entry whenever a
 * defence is added; an entry whose `find` text no longer occurs exactly once fails the check, so the
 * list cannot silently go stale.
 */
export interface Mutation {
  /** What the break does, as a reviewer would say it. */
  name: string;
  /** Repository-relative file the break is applied to. */
  file: string;
  /** Text that must occur exactly once in `file`... */
  find: string;
  /** ...and what it is replaced with. */
  replace: string;
  /** Test files (repository-relative) that must fail with the break applied. Unit tests: fast. */
  tests: string[];
  /** Only the tests whose name contains this (`deno test --filter`): for a slow file's one test. */
  filter?: string;
}

const EGRESS_POLICY = "lib/proxy/egress_policy.ts";
const EGRESS_PROXY = "lib/proxy/egress_proxy.ts";
const ADDRESS_GUARD = "lib/proxy/address_guard.ts";
const UPSTREAM_POOL_TESTS = "tests/security/egress_upstream_pool_test.ts";
const EGRESS_TESTS = ["tests/unit/egress_proxy_test.ts", "tests/unit/address_guard_test.ts"];
const CREDENTIAL_PROXY = "lib/proxy/credential_proxy.ts";
const GIT_PROXY = "lib/proxy/git_proxy.ts";
const GIT_PROTOCOL = "lib/proxy/git_protocol.ts";
const GIT_TESTS = ["tests/unit/git_proxy_test.ts"];
const CONFIG = "lib/config.ts";
const LLM_POLICY = "lib/proxy/llm_policy.ts";
const CREDENTIAL_TESTS = ["tests/unit/credential_proxy_test.ts"];
const SECRET_GUARD = "lib/secret_guard.ts";
const SECRET_GUARD_TESTS = ["tests/unit/secret_guard_test.ts"];
const DOCKER_PROVIDER = "lib/sandbox/docker_provider.ts";
const HOST_PROVIDER = "lib/sandbox/host_provider.ts";
const AGENT_ROUTE_TESTS = ["tests/unit/agent_api_routes_test.ts"];
const MCP_CONFINE = "lib/mcp/confine.ts";
const MCP_TESTS = ["tests/security/mcp_test.ts"];

const DOCTOR_VERDICTS = "lib/doctor/verdicts.ts";
const DOCTOR_TESTS = ["tests/unit/doctor_verdicts_test.ts"];
/** `sandbox doctor` must never call HELD what its attack got through. */
const DOCTOR_MUTATIONS: Mutation[] = [
  {
    name: "doctor (kubernetes): a connection out of the sandbox pod counts as refused",
    file: "lib/doctor/kubernetes.ts",
    find: `reached: code === "0" ? [`,
    replace: `reached: code === "never" ? [`,
    tests: ["tests/unit/doctor_kubernetes_test.ts", "tests/security/doctor_kubernetes_test.ts"],
  },
  {
    name: "doctor (kubernetes): flannel alone is said to enforce NetworkPolicy",
    file: "lib/doctor/kubernetes.ts",
    find: `[/flannel/, "flannel", false],`,
    replace: `[/flannel/, "flannel", true],`,
    tests: ["tests/unit/doctor_kubernetes_test.ts", "tests/security/doctor_kubernetes_test.ts"],
  },
  {
    name: "doctor: the key check calls HELD an attack that found the canary",
    file: DOCTOR_VERDICTS,
    find: `if (seen.canaryFound.length > 0) {`,
    replace: `if (seen.canaryFound.length > 1e9) {`,
    tests: DOCTOR_TESTS,
  },
  {
    name: "doctor: a network check calls HELD an attack that reached the service",
    file: DOCTOR_VERDICTS,
    find: `if (seen.reached.length > 0) {`,
    replace: `if (seen.reached.length > 1e9) {`,
    tests: DOCTOR_TESTS,
  },
  {
    name: "doctor: a missing egress proxy (network mode full) is not BROKEN",
    file: DOCTOR_VERDICTS,
    find: `if (seen.absent !== undefined) {`,
    replace: `if (seen.absent === "never") {`,
    tests: DOCTOR_TESTS,
  },
  {
    name: "doctor: HELD without a twin that got through",
    file: DOCTOR_VERDICTS,
    find: `if (!seen.twinReached) {`,
    replace: `if (seen.twinReached && !seen.twinReached) {`,
    tests: DOCTOR_TESTS,
  },
  {
    name: "doctor: a user namespace the sandbox user made is not an escalation",
    file: DOCTOR_VERDICTS,
    find: `if (seen.unshare === "succeeded") gained.push`,
    replace: `if (seen.unshare === "never") gained.push`,
    tests: DOCTOR_TESTS,
  },
  {
    name: "doctor: effective capabilities are not an escalation",
    file: DOCTOR_VERDICTS,
    find: `if (!/^0+$/.test(seen.capEff) || !/^0+$/.test(seen.capPrm))`,
    replace: `if (!/^0+$/.test(seen.capPrm))`,
    tests: DOCTOR_TESTS,
  },
  {
    name: "doctor: a setsid child alive after the sandbox was destroyed is not BROKEN",
    file: DOCTOR_VERDICTS,
    find: `if (seen.aliveAfterDestroy) {`,
    replace: `if (seen.aliveAfterDestroy && !seen.aliveAfterDestroy) {`,
    tests: DOCTOR_TESTS,
  },
  {
    name:
      "doctor: a setsid child alive after its command is excused in every mode, not mode local's",
    file: DOCTOR_VERDICTS,
    find: `if (seen.aliveAfterCommand && excused === undefined) {`,
    replace: `if (seen.aliveAfterCommand && excused === "never") {`,
    tests: DOCTOR_TESTS,
  },
  {
    name: "doctor (local): the host's listeners answering the sandbox count as refused",
    file: "lib/doctor/local.ts",
    find: `if (rest?.includes(observed.nonce)) reached.push(target);`,
    replace: `if (rest === observed.nonce) reached.push(target);`,
    tests: ["tests/security/doctor_local_test.ts"],
    filter: "shares the host's network",
  },
  {
    name:
      "doctor (local): network mode full is NOT APPLICABLE even where the sandbox has a network",
    file: "lib/doctor/local.ts",
    find: `if (profile.sandbox.network.mode !== "full" || interfaces !== "lo") return checks;`,
    replace: `if (profile.sandbox.network.mode !== "full") return checks;`,
    tests: ["tests/security/doctor_local_test.ts"],
    filter: "network mode full when the sandbox shares",
  },
  {
    name: "doctor (local): rlimits are said to hold memory and CPU as a cgroup would",
    file: "lib/doctor/local.ts",
    find: 'const cgroup = limits === "rlimit" ? undefined : `its cgroup (${limits})`;',
    replace: "const cgroup = `its cgroup (${limits})`;",
    tests: ["tests/unit/doctor_local_test.ts"],
  },
  {
    name: "doctor: a user namespace the probe made is read as refused",
    file: "lib/doctor/probes.ts",
    find: `unshare[0] === "0" ? "succeeded" : "refused",`,
    replace: `unshare[0] === "never" ? "succeeded" : "refused",`,
    tests: ["tests/security/doctor_local_test.ts"],
    filter: "no seccomp filter",
  },
  {
    name: "doctor: a write past resources.disk that ran to its end is HELD",
    file: DOCTOR_VERDICTS,
    find: `  if (seen.attackCompleted) {`,
    replace: `  if (seen.attackCompleted && !seen.attackCompleted) {`,
    tests: DOCTOR_TESTS,
  },
  {
    name: "doctor: the egress proxy's 403 to a name off the allowlist is read as let through",
    file: "lib/doctor/doctor.ts",
    find: `!["403", "000", "none"].includes(denied.code)`,
    replace: `!["000", "none"].includes(denied.code)`,
    tests: ["tests/security/doctor_test.ts"],
  },
];

const POD_SPEC = "lib/sandbox/kubernetes/pod_spec.ts";
const POD_SPEC_TESTS = ["tests/unit/kubernetes_pod_spec_test.ts"];

/** The Kubernetes pod's hardening and its NetworkPolicy, each weakened on its own. */
const KUBERNETES_POD_RULES: Mutation[] = [
  [
    "a pod container may gain privileges (setuid)",
    "    allowPrivilegeEscalation: false,\n",
    "    allowPrivilegeEscalation: true,\n",
  ],
  [
    "the service-account token is mounted into the sandbox pod",
    "      automountServiceAccountToken: false,\n",
    "      automountServiceAccountToken: true,\n",
  ],
  [
    "a pod container keeps its capabilities",
    '    capabilities: { drop: ["ALL"] },\n',
    "    capabilities: { drop: [] },\n",
  ],
  [
    "a pod container's root filesystem is writable",
    "    readOnlyRootFilesystem: true,\n",
    "    readOnlyRootFilesystem: false,\n",
  ],
  [
    "the sandbox pod shares the node's network namespace",
    "      hostNetwork: false,\n",
    "      hostNetwork: true,\n",
  ],
  [
    "the sandbox pod shares the node's process namespace",
    "      hostPID: false,\n",
    "      hostPID: true,\n",
  ],
  [
    "the pod's containers share one process namespace (the agent sees the relay)",
    "      shareProcessNamespace: false,\n",
    "      shareProcessNamespace: true,\n",
  ],
  [
    "a NetworkPolicy that allows egress counts as deny-all",
    "(spec.ingress ?? []).length === 0 && (spec.egress ?? []).length === 0",
    "(spec.ingress ?? []).length === 0",
  ],
  [
    "the NetworkPolicy the tool writes allows all egress",
    "      egress: [],\n",
    "      egress: [{}],\n",
  ],
].map(([name, find, replace]) => ({ name, file: POD_SPEC, find, replace, tests: POD_SPEC_TESTS }));

const BUDGET = "lib/proxy/budget.ts";
const BUDGET_TESTS = ["tests/unit/budget_test.ts", "tests/security/budget_attack_test.ts"];

/** Each point where a run's budget is enforced, broken on its own. */
const BUDGET_MUTATIONS: Mutation[] = [
  {
    name: "credential proxy: a request past the run's budget goes to the upstream all the same",
    file: CREDENTIAL_PROXY,
    find: `if (refused !== undefined) return new Refusal(403, "permission_error", refused);`,
    replace: `void refused;`,
    tests: ["tests/security/budget_attack_test.ts"],
  },
  {
    name: "LLM requests are not counted when admitted (many at once all start)",
    file: BUDGET,
    find: `    this.#used.requests++;\n`,
    replace: ``,
    tests: BUDGET_TESTS,
  },
  {
    name: "a streaming response is never cut: usage events are not charged as they pass",
    file: BUDGET,
    find: `if (!this.#account(sseUsage(this.#decoder.decode(event)))) {`,
    replace: `if (!this.#account(undefined)) {`,
    tests: BUDGET_TESTS,
  },
  {
    name: "a JSON response's usage is never charged",
    file: BUDGET,
    find: `this.#account(reportedUsage(JSON.parse(this.#decoder.decode(concat(...this.#body)))));`,
    replace: `this.#account(undefined);`,
    tests: BUDGET_TESTS,
  },
  {
    name: "a response that reports no usage costs nothing",
    file: BUDGET,
    find: `if (!this.#reported && this.#ok) {`,
    replace: `if (false) {`,
    tests: BUDGET_TESTS,
  },
  {
    name: "a model with no price passes a cost budget for free",
    file: BUDGET,
    find: `if (cost === null && this.limits.cost_usd !== undefined) {`,
    replace: `if (false) {`,
    tests: ["tests/unit/budget_test.ts"],
  },
  {
    name: "egress proxy: a request past the run's budget is let through",
    file: EGRESS_PROXY,
    find: `if (refused !== undefined) throw new ProxyRefusal(403, "deny", refused);`,
    replace: `void refused;`,
    tests: ["tests/security/budget_attack_test.ts"],
  },
  {
    name: "egress proxy: bytes past the run's budget keep flowing (no cut)",
    file: EGRESS_PROXY,
    find:
      `if (budget.chargeEgress(bytes)) return;\n      for (const conn of this.#liveConns) closeQuietly(conn);`,
    replace: `budget.chargeEgress(bytes);`,
    tests: ["tests/security/budget_attack_test.ts"],
  },
  {
    name: "egress requests are not counted when admitted",
    file: BUDGET,
    find: `    this.#used.egress_requests++;\n`,
    replace: ``,
    tests: BUDGET_TESTS,
  },
  {
    name: "a run starts over its profile's budget for the day",
    file: "lib/run/period_budget.ts",
    find: `if (left <= 0) {`,
    replace: `if (left < -Infinity) {`,
    tests: ["tests/unit/budget_test.ts"],
  },
];

/** Every rule of the secret-name pattern, each dropped on its own. */
const SECRET_NAME_RULES: Mutation[] = [
  ...[
    "KEY",
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "PASSPHRASE",
    "CREDENTIAL",
    "PRIVATE",
    "AUTH",
    "COOKIE",
    "SESSION",
    "DSN",
    "DATABASE_URL",
  ]
    .map((word) => ({
      name: `secret-name pattern without ${word}`,
      file: SECRET_GUARD,
      find: `  "${word}",\n`,
      replace: ``,
      tests: SECRET_GUARD_TESTS,
    })),
  ...["SSH_AUTH_SOCK", "DOCKER_HOST", "KUBECONFIG", "NETRC"].map((exact) => ({
    name: `exact secret names without ${exact}`,
    file: SECRET_GUARD,
    find: `"${exact}"`,
    replace: `"NOT-${exact}"`,
    tests: SECRET_GUARD_TESTS,
  })),
];

const LOCAL_SANDBOX = "lib/sandbox/local/local_sandbox.ts";
const LOCAL_BWRAP = "lib/sandbox/local/bwrap.ts";
const LOCAL_LAUNCHER = "lib/sandbox/local/launcher.ts";
const LOCAL_TESTS = ["tests/security/local_mode_test.ts"];
/** Sandbox mode local's defences (docs/local.md), each caught by its attack. */
const LOCAL_MUTATIONS: Mutation[] = [
  {
    name: "mode local: a run's Deno cache is the warmed one itself (a hard link), not a copy",
    file: "lib/sandbox/local/deno_cache.ts",
    find: "    await Deno.copyFile(`${from}/${name}`, `${to}/${name}`);",
    replace: "    await Deno.link(`${from}/${name}`, `${to}/${name}`);",
    tests: LOCAL_TESTS,
    filter: "Deno cache",
  },
  {
    name: "mode local: a command inherits the host's environment",
    file: LOCAL_SANDBOX,
    find: "      env: command.env,\n      clearEnv: true,",
    replace: "      env: command.env,\n      clearEnv: false,",
    tests: LOCAL_TESTS,
  },
  {
    name: "mode local: the sandbox shares the host's network",
    file: LOCAL_BWRAP,
    find: `    "--unshare-all",\n`,
    replace: `    "--unshare-all",\n    "--share-net",\n`,
    tests: LOCAL_TESTS,
  },
  {
    name: "mode local: the sandbox's root stays writable",
    file: LOCAL_BWRAP,
    find: `    "--remount-ro",\n    "/",\n`,
    replace: "",
    tests: LOCAL_TESTS,
  },
  {
    name: "mode local: no seccomp filter",
    file: LOCAL_LAUNCHER,
    find:
      'syscall($seccomp, 1, 0, pack("S x6 P", length($program) / 8, $program)) == 0 or fail("seccomp");',
    replace: "",
    tests: LOCAL_TESTS,
  },
  {
    name:
      "mode local: a command enters the namespaces of whatever process has the holder's pid (one that took a dead holder's pid: the host's)",
    file: LOCAL_LAUNCHER,
    find: '$fields[19] eq $started or fail("the sandbox has ended (process $holder is another)");',
    replace: "",
    tests: LOCAL_TESTS,
    filter: "took the holder's pid",
  },
  {
    name: "mode local: commands are still started once the holder has ended",
    file: LOCAL_SANDBOX,
    find: "if (!this.#holder || this.#destroyed || this.#holderEnded) {",
    replace: "if (!this.#holder || this.#destroyed) {",
    tests: LOCAL_TESTS,
    filter: "took the holder's pid",
  },
  {
    name: "mode local: a command keeps the capabilities it has in its own user namespace",
    file: LOCAL_LAUNCHER,
    find: "  next if syscall($prctl, 24, $cap, 0, 0, 0) == 0;",
    replace: "  next;",
    tests: LOCAL_TESTS,
    filter: "escalation",
  },
  {
    name: "mode local: a stopped command's leftovers are not swept",
    file: LOCAL_SANDBOX,
    find: "if (ended.timedOut || ended.aborted || ended.signal !== null) await this.#sweep();",
    replace: "if (ended.timedOut && ended.aborted) await this.#sweep();",
    tests: LOCAL_TESTS,
  },
  {
    name: "mode local: no Landlock ruleset on the command (the mount namespace alone)",
    file: LOCAL_SANDBOX,
    find: `      landlock: "abi" in this.landlock ? landlockRules(this.landlock.abi) : undefined,`,
    replace: "      landlock: undefined,",
    tests: LOCAL_TESTS,
    filter: "Landlock",
  },
  {
    name: "mode local: Landlock's ruleset lets everything beneath / be read and written",
    file: "lib/sandbox/local/landlock.ts",
    find: `  ["/usr", READ_EXEC],\n`,
    replace: `  ["/", ALL],\n  ["/usr", READ_EXEC],\n`,
    tests: LOCAL_TESTS,
    filter: "Landlock",
  },
  {
    name:
      "mode local: an agent CLI's files are bound read-write (the agent changes its own program)",
    file: LOCAL_BWRAP,
    find: "...(programs.agent ? bind(programs.agent.dir, programs.agent.at) : []),",
    replace: "...(programs.agent ? bind(programs.agent.dir, programs.agent.at, false) : []),",
    tests: ["tests/e2e/local_agent_cli_test.ts"],
    filter: "Claude Code",
  },
  {
    name:
      "mode local: the relay outlives its session (the end of its stdin ignored), still carrying what it carried",
    file: "lib/sandbox/local/relay.ts",
    find: "if (vec($r, 0, 1)) { exit 0 unless sysread(STDIN, my $ignored, 65536) }",
    replace: "if (vec($r, 0, 1)) { sysread(STDIN, my $ignored, 65536) }",
    tests: ["tests/unit/relay_host_test.ts"],
    filter: "Perl relay: on the socket path, closing the relay's stdin",
  },
  {
    name:
      "mode local: the relay with no descriptor left accepts again at once (spinning, or refusing what it could carry soon)",
    file: "lib/sandbox/local/relay.ts",
    find: "  $paused = time + 1;\n}",
    replace: "  1;\n}",
    tests: ["tests/unit/relay_host_test.ts"],
    filter: "Perl relay: with no descriptor left",
  },
  {
    name:
      "mode local: the relay drops a connection it accepted with no descriptor left for its proxy's socket",
    file: "lib/sandbox/local/relay.ts",
    find: "    return push @waiting, [$c, $path];",
    replace: "    return close $c;",
    tests: ["tests/unit/relay_host_test.ts"],
    filter: "Perl relay: with no descriptor left",
  },
];

export const MUTATIONS: Mutation[] = [
  {
    name: "allowlist wildcard matches without the dot (evilexample.com for *.example.com)",
    file: EGRESS_POLICY,
    find: `canonical.endsWith("." + rule.host)`,
    replace: `canonical.endsWith(rule.host)`,
    tests: ["tests/unit/egress_policy_test.ts"],
  },
  {
    name: "allowlist rule without a port allows any port",
    file: EGRESS_POLICY,
    find: `? DEFAULT_PORTS.includes(port)`,
    replace: `? true`,
    tests: ["tests/unit/egress_policy_test.ts"],
  },
  {
    name:
      "egress proxy connects to whatever an allowed name resolves to (loopback, private, metadata)",
    file: ADDRESS_GUARD,
    find: `const why = internalAddressReason(address, local);`,
    replace: `const why = undefined;`,
    tests: EGRESS_TESTS,
  },
  {
    name:
      "egress proxy: the upstream pool's key leaves out the host (one destination's connection carries another's requests)",
    file: EGRESS_PROXY,
    find: "return `${target.host}:${target.port}`;",
    replace: "return `${target.port}`;",
    tests: [UPSTREAM_POOL_TESTS],
    filter: "two allowed destinations",
  },
  {
    name: "egress proxy: an idle upstream connection is taken by a request for any destination",
    file: "lib/proxy/upstream_pool.ts",
    find: "for (const upstream of this.#idle.keys()) if (upstream.key === key) found = upstream;",
    replace: "for (const upstream of this.#idle.keys()) found = upstream;",
    tests: [UPSTREAM_POOL_TESTS],
    filter: "two allowed destinations",
  },
  {
    name: "egress proxy: an upstream connection whose response said Connection: close is pooled",
    file: EGRESS_PROXY,
    find: `upstreamReusable: framing.kind !== "close" && upstreamKeepsAlive &&`,
    replace: `upstreamReusable: framing.kind !== "close" &&`,
    tests: [UPSTREAM_POOL_TESTS],
    filter: "Connection: close",
  },
  {
    name: "egress proxy: a POST that a pooled connection dropped unanswered is sent again",
    file: EGRESS_PROXY,
    find: "RETRYABLE_METHODS.has(exchange.head.method);",
    replace: "true;",
    tests: [UPSTREAM_POOL_TESTS],
    filter: "drops unanswered",
  },
  {
    name: "egress proxy: only the first request of a kept-alive connection is logged",
    file: EGRESS_PROXY,
    find: `if (tally.bytesOut > 0) {
        this.#options.log?.write({`,
    replace:
      `if (tally.bytesOut > 0 && !("logged" in client) && Object.assign(client, { logged: true })) {
        this.#options.log?.write({`,
    tests: ["tests/security/egress_keep_alive_test.ts"],
  },
  {
    name: "a project sandbox.yaml may set state.retention (and remove every project's runs)",
    file: CONFIG,
    find:
      `if (result.kind !== "ok" || result.config.state?.retention === undefined) return result;`,
    replace: `return result;`,
    tests: ["tests/unit/retention_test.ts"],
  },
  {
    name: "the access log keeps appending to a file sandbox prune has moved aside (entries lost)",
    file: "lib/proxy/access_log.ts",
    find: "if (current?.ino === open.ino) {",
    replace: "if (current !== undefined || open !== undefined) {",
    tests: ["tests/e2e/prune_test.ts"],
    filter: "loses no access log entry",
  },
  {
    name: "sandbox prune --images removes an image a container was created from",
    file: "lib/sandbox/image_prune.ts",
    find: "if (used.has(image.id)) {",
    replace: "if (used.has(image.id) && false) {",
    tests: ["tests/e2e/prune_test.ts"],
    filter: "--images",
  },
  {
    name: "sandbox prune removes a running run",
    file: "lib/run/retention.ts",
    find: `const finished = runs.filter((run) => run.status !== "running");`,
    replace: `const finished = runs.filter(() => true);`,
    tests: ["tests/unit/retention_test.ts"],
  },
  {
    name: "egress proxy connects by name after checking the address (DNS rebinding)",
    file: EGRESS_PROXY,
    find: `return { conn: await dial(address, target.port, one), address };`,
    replace: `return { conn: await dial(target.host, target.port, one), address };`,
    tests: ["tests/unit/egress_proxy_test.ts"],
  },
  {
    name: "egress proxy connects to an internal IP literal target",
    file: ADDRESS_GUARD,
    find: `const source = isIpLiteral(host) ? "literal" : "dns";`,
    replace:
      `if (isIpLiteral(host)) return { kind: "connect", addresses: [unbracket(host)], source: "literal", refused: [] };
  const source = isIpLiteral(host) ? "literal" : "dns";`,
    tests: ["tests/unit/egress_proxy_test.ts"],
  },
  {
    name: "egress proxy connects to the host's own interface addresses",
    file: ADDRESS_GUARD,
    find: `return isLocal(bytes, local) ? "one of this host's own addresses" : undefined;`,
    replace: `return undefined;`,
    tests: EGRESS_TESTS,
  },
  {
    name: "egress proxy judges IPv4-mapped, NAT64 and 6to4 forms without the IPv4 they carry",
    file: ADDRESS_GUARD,
    find: `const inner = ipv4Class(v4) ??`,
    replace: `const inner = undefined ??`,
    tests: EGRESS_TESTS,
  },
  {
    name: "egress proxy connects to 10.0.0.0/8",
    file: ADDRESS_GUARD,
    find: `["10.0.0.0/8", "a private address"],`,
    replace: ``,
    tests: EGRESS_TESTS,
  },
  {
    name: "proxy token comparison always equal",
    file: CREDENTIAL_PROXY,
    find: `return difference === 0;`,
    replace: `return true;`,
    tests: ["tests/unit/credential_proxy_test.ts"],
  },
  {
    name: "git push of any ref allowed",
    file: GIT_PROTOCOL,
    find: `if (update.ref !== allowed) {`,
    replace: `if (false) {`,
    tests: ["tests/unit/git_proxy_test.ts"],
  },
  {
    name: "git push checks only the first ref update",
    file: GIT_PROTOCOL,
    find: `for (const update of updates) {`,
    replace: `for (const update of updates.slice(0, 1)) {`,
    tests: ["tests/unit/git_proxy_test.ts"],
  },
  {
    name: "git proxy accepts a POST with a query (the query-string bypass)",
    file: GIT_PROTOCOL,
    find: `if (query !== undefined) {`,
    replace: `if (false) {`,
    tests: GIT_TESTS,
  },
  {
    name: "git proxy serves receive-pack to a session without a push grant",
    file: GIT_PROXY,
    find: `if (route.service === "git-receive-pack" && remote.push === false) {`,
    replace: `if (false) {`,
    tests: GIT_TESTS,
  },
  {
    name: "git push: several updates of the allowed branch in one push allowed",
    file: GIT_PROTOCOL,
    find: `if (updates.length > 1) {`,
    replace: `if (false) {`,
    tests: GIT_TESTS,
  },
  {
    name: "git push: a gzip-encoded push checked without decoding it",
    file: GIT_PROXY,
    find:
      `const decoded = encoding ? source.pipeThrough(new DecompressionStream("gzip")) : source;`,
    replace: `const decoded = source;`,
    tests: GIT_TESTS,
  },
  {
    name: "git push: command section read without a size bound",
    file: GIT_PROXY,
    find:
      `if (commands ? commands.end > MAX_COMMAND_BYTES : buffered.byteLength >= MAX_COMMAND_BYTES) {`,
    replace: `if (false) {`,
    tests: GIT_TESTS,
  },
  {
    name: "pretty transcript prints the agent's control characters raw",
    file: "lib/run/transcript.ts",
    find: `return escapeControls(renderRaw(message));`,
    replace: `return renderRaw(message);`,
    tests: ["tests/unit/transcript_test.ts"],
  },
  {
    name: "git push deleting the allowed branch allowed",
    file: GIT_PROTOCOL,
    find: `if (ZERO_ID.test(update.new)) return`,
    replace: `if (false) return`,
    tests: ["tests/unit/git_proxy_test.ts"],
  },
  {
    name: "secrets not redacted",
    file: "lib/redact.ts",
    find: `return text.replace(this.#pattern, REDACTED);`,
    replace: `return text;`,
    tests: ["tests/unit/redact_test.ts"],
  },
  {
    name: "a project sandbox.yaml may use a key command",
    file: CONFIG,
    find: `...(profile.llm.key && "command" in profile.llm.key
        ? [`,
    replace: `...(false
        ? [`,
    tests: ["tests/unit/config_test.ts"],
  },
  {
    name: "a project sandbox.yaml may use a git token command",
    file: CONFIG,
    find: `...(profile.git.token && "command" in profile.git.token
        ? [`,
    replace: `...(false
        ? [`,
    tests: ["tests/unit/config_test.ts"],
  },
  {
    name: "a built-in provider accepts a base_url (its key would go elsewhere)",
    file: CONFIG,
    find: `} else if (llm.base_url) {`,
    replace: `} else if (false) {`,
    tests: ["tests/unit/config_test.ts"],
  },
  {
    name: "an untrusted project sandbox.yaml is obeyed",
    file: CONFIG,
    find: `if (state !== "trusted") {`,
    replace: `if (false) {`,
    tests: ["tests/unit/config_test.ts"],
  },
  {
    name: "a trusted project file stays trusted after it changes",
    file: "lib/trust.ts",
    find: `return entry.sha256 === await sha256OfBytes(bytes) ? "trusted" : "changed";`,
    replace: `return "trusted";`,
    tests: ["tests/unit/trust_test.ts", "tests/unit/config_test.ts"],
  },
  {
    name: "a configured value may carry a known secret under an innocent name",
    file: CONFIG,
    find: `const issues = secretValueIssues(result.config, env);`,
    replace: `const issues: ConfigIssue[] = [];`,
    tests: ["tests/unit/config_test.ts"],
  },
  {
    name: "docker exec (or the waiting wrapper) passes a known secret in its environment or argv",
    file: DOCKER_PROVIDER,
    find:
      'assertNoSecrets(`sandbox "${this.names.container}"`, {\n      env: options.env,\n      envKind: "exec environment",\n      argv,\n    });',
    replace: ``,
    tests: SECRET_GUARD_TESTS,
  },
  {
    name: "the container environment may carry a known secret",
    file: DOCKER_PROVIDER,
    find:
      'assertNoSecrets(`sandbox "${this.names.container}"`, {\n      env: { ...env, ...this.profile.sandbox.environment.set },\n      envKind: "container environment",\n    });',
    replace: ``,
    tests: SECRET_GUARD_TESTS,
  },
  {
    name: "a file written into the sandbox may carry a known secret",
    file: DOCKER_PROVIDER,
    find: 'assertNoSecrets(`sandbox "${this.names.container}"`, { file: { path, data } });',
    replace: ``,
    tests: SECRET_GUARD_TESTS,
  },
  {
    name: "sandbox mode none passes a known secret to the host command",
    file: HOST_PROVIDER,
    find:
      `assertNoSecrets("the host process (sandbox mode none)", {\n    env: options.env,\n    envKind: "environment",\n    argv,\n  });`,
    replace: ``,
    tests: SECRET_GUARD_TESTS,
  },
  {
    name: "a key resolved by KeyStore is not known to the secret guard",
    file: "lib/keys.ts",
    find: "registerSecret(key, `the key from ${describeKeySource(source)}`);",
    replace: ``,
    tests: SECRET_GUARD_TESTS,
  },
  {
    name: "exec -e accepts a secret-looking name",
    file: "cli/context.ts",
    find: `if (isSecretName(name)) {`,
    replace: `if (false) {`,
    tests: ["tests/e2e/config_errors_test.ts"],
  },
  {
    name:
      "credential proxy forwards every incoming header (the token as x-api-key reaches an OpenAI-style provider)",
    file: CREDENTIAL_PROXY,
    find: `const headers = forwardedHeaders(options.api, incoming, options.policy);`,
    replace: `const headers = new Headers(incoming);
  for (const name of ["authorization", "host", "content-length", "connection"]) headers.delete(name);`,
    tests: CREDENTIAL_TESTS,
  },
  {
    name: "credential proxy forwards an incoming x-api-key to an OpenAI-style provider",
    file: CREDENTIAL_PROXY,
    find: `if (options.rule.method === "POST") headers.set("content-type", "application/json");`,
    replace: `if (options.rule.method === "POST") headers.set("content-type", "application/json");
  if (incoming.has("x-api-key")) headers.set("x-api-key", incoming.get("x-api-key")!);`,
    tests: CREDENTIAL_TESTS,
  },
  {
    name: "credential proxy follows redirects (with the key attached)",
    file: CREDENTIAL_PROXY,
    find: `redirect: "manual",`,
    replace: `redirect: "follow",`,
    tests: CREDENTIAL_TESTS,
  },
  {
    name: "a built-in provider's key goes to a base_url that got past the schema (llmTarget)",
    file: "lib/proxy/llm_providers.ts",
    find: `baseUrl: builtin.baseUrl,`,
    replace: `baseUrl: llm.base_url ?? builtin.baseUrl,`,
    tests: ["tests/unit/config_test.ts"],
  },
  {
    name: "credential proxy skips the body checks (server-side tools, models)",
    file: CREDENTIAL_PROXY,
    find: `const refusal = rule.check?.(value, policy);`,
    replace: `const refusal = undefined as ReturnType<NonNullable<RouteRule["check"]>>;`,
    tests: CREDENTIAL_TESTS,
  },
  {
    name: "Anthropic server-side tool types allowed",
    file: LLM_POLICY,
    find: `if (typeof type === "string" && ANTHROPIC_CLIENT_TOOL.test(type)) continue;`,
    replace: `continue;`,
    tests: CREDENTIAL_TESTS,
  },
  {
    name: "OpenAI-style server-side tool types allowed",
    file: LLM_POLICY,
    find: `if (typeof type !== "string" || !OPENAI_CHAT_CLIENT_TOOLS.has(type)) {`,
    replace: `if (false) {`,
    tests: CREDENTIAL_TESTS,
  },
  {
    name: "Anthropic MCP connector (mcp_servers) allowed",
    file: LLM_POLICY,
    find: `if (present(body.mcp_servers)) {`,
    replace: `if (false) {`,
    tests: CREDENTIAL_TESTS,
  },
  {
    name: "search models allowed",
    file: LLM_POLICY,
    find: `if (SEARCH_MODEL.test(base)) {`,
    replace: `if (false) {`,
    tests: CREDENTIAL_TESTS,
  },
  {
    name: "URL image and document sources allowed",
    file: LLM_POLICY,
    find: `if (source.type === "url") return true;`,
    replace: ``,
    tests: CREDENTIAL_TESTS,
  },
  {
    name: "server-side anthropic-beta flags forwarded",
    file: LLM_POLICY,
    find: `flag !== "" && (policy.serverTools === "allow" || !SERVER_SIDE_BETA.test(flag))`,
    replace: `flag !== ""`,
    tests: CREDENTIAL_TESTS,
  },
  {
    name: "llm.models not enforced",
    file: LLM_POLICY,
    find: `policy.models !== undefined && (typeof model !== "string"`,
    replace: `false && (typeof model !== "string"`,
    tests: CREDENTIAL_TESTS,
  },
  {
    name: "llm.models not passed from the profile to the session's proxy",
    file: "lib/proxy/session.ts",
    find: `policy: configured.policy,`,
    replace: ``,
    tests: ["tests/unit/session_policy_test.ts"],
  },
  {
    name: "duplicate keys in a request body accepted",
    file: "lib/proxy/strict_json.ts",
    find: `if (seen.has(key)) {`,
    replace: `if (false) {`,
    tests: [...CREDENTIAL_TESTS, "tests/unit/strict_json_test.ts"],
  },
  {
    name: "response bodies to the sandbox not redacted",
    file: CREDENTIAL_PROXY,
    find: `const out = redacting.push(metered.pass);`,
    replace: `const out = metered.pass;`,
    tests: CREDENTIAL_TESTS,
  },
  {
    name: "response headers to the sandbox not redacted",
    file: CREDENTIAL_PROXY,
    find: `responseHeaders.append(name, redactor.redact(value));`,
    replace: `responseHeaders.append(name, value);`,
    tests: CREDENTIAL_TESTS,
  },
  {
    name: "stream redaction holds nothing back (a secret split across chunks passes)",
    file: "lib/redact.ts",
    find: `const hold = final ? text.length : heldFrom(text, forms, longest, position);`,
    replace: `const hold = text.length;`,
    tests: ["tests/unit/redact_test.ts", ...CREDENTIAL_TESTS],
  },
  {
    name: "--record files not redacted",
    file: "lib/run/replay.ts",
    find: `redactor.redactJson(JSON.stringify(recording, null, 2))`,
    replace: `JSON.stringify(recording, null, 2)`,
    tests: ["tests/unit/recorder_redaction_test.ts"],
  },
  {
    name: "Responses API: any tool passes (web search, code interpreter, MCP…)",
    file: LLM_POLICY,
    find: `const refusal = responsesToolRefusal(tool, \`tools[\${index}]\`);`,
    replace: `const refusal = undefined;`,
    tests: AGENT_ROUTE_TESTS,
  },
  {
    name: "Responses API: a namespace of tools is taken on trust",
    file: LLM_POLICY,
    find: `const refusal = responsesToolRefusal(inner, \`\${where}.tools[\${index}]\`);`,
    replace: `const refusal = undefined;`,
    tests: AGENT_ROUTE_TESTS,
  },
  {
    name: "Responses API: tool search run by the provider passes",
    file: LLM_POLICY,
    find:
      `if (type === "tool_search" && isObject(tool) && tool.execution === "client") return undefined;`,
    replace: `if (type === "tool_search") return undefined;`,
    tests: AGENT_ROUTE_TESTS,
  },
  {
    name: "Responses API: inputs the provider would fetch pass",
    file: LLM_POLICY,
    find: `        if (partUrl(part) !== undefined) {
          return serverSide(
            \`input[`,
    replace: `        if (false) {
          return serverSide(
            \`input[`,
    tests: AGENT_ROUTE_TESTS,
  },
  {
    name: "token counting forwarded without the Messages checks",
    file: LLM_POLICY,
    find: `"/messages/count_tokens": { method: "POST", api: "anthropic", check: checkMessages },`,
    replace: `"/messages/count_tokens": { method: "POST", api: "anthropic" },`,
    tests: AGENT_ROUTE_TESTS,
  },
  {
    name: "an agent CLI's package is used without checking its pinned integrity",
    file: "lib/agents/npm_tarball.ts",
    find: `  if (integrity !== tarball.integrity) {`,
    replace: `  if (false) {`,
    tests: ["tests/unit/agent_image_test.ts"],
  },
  {
    name: "an agent CLI's prompt goes on its command line",
    file: "lib/run/container_driver.ts",
    find:
      `yield* this.#stream(["sh", "-c", ENTER_CWD, "sandbox-agent", options.cwd, ...launch.argv], {`,
    replace:
      `yield* this.#stream(["sh", "-c", ENTER_CWD, "sandbox-agent", options.cwd, ...launch.argv, prompt], {`,
    tests: ["tests/unit/agent_driver_test.ts"],
  },
  {
    name: "closing a session leaves its token working (not revoked, its proxies still serving)",
    file: "lib/proxy/session.ts",
    find: `context.tokens.revoke(context.token);`,
    replace: `return;`,
    tests: ["tests/unit/session_token_test.ts"],
  },
  {
    name: "session tokens are not random (a token captured in one session works in the next)",
    file: CREDENTIAL_PROXY,
    find: `base64Url(crypto.getRandomValues(new Uint8Array(32)))`,
    replace: `base64Url(new Uint8Array(32))`,
    tests: ["tests/unit/session_token_test.ts"],
  },
  {
    name: "sandbox mode none gives the worker the host's environment (the key with it)",
    file: HOST_PROVIDER,
    find: `clearEnv: true,`,
    replace: `clearEnv: false,`,
    tests: ["tests/unit/host_provider_test.ts"],
  },
  {
    name:
      "a run in sandbox mode none leaves its proxies serving its token after it ends (library use)",
    file: "lib/run/run.ts",
    find: `  context.cleanups.push(() => proxies.close());`,
    replace: ``,
    // No Docker: mode none runs the worker on this host (a few seconds).
    tests: ["tests/security/run_token_library_test.ts"],
  },
  {
    name: "an exec's variables go on the docker command line (the session token in `ps`)",
    file: "lib/sandbox/docker_env.ts",
    find: '    args.push("--env", `${EXEC_ENV_PREFIX}${name}`);',
    replace: '    args.push("--env", `${name}=${value}`);',
    tests: ["tests/unit/docker_provider_test.ts"],
  },
  {
    name: "the container's variables go on the docker run command line",
    file: "lib/sandbox/docker_env.ts",
    find: `      args.push("--env", name);\n      clientEnv[name] = value;`,
    replace: '      args.push("--env", `${name}=${value}`);',
    tests: ["tests/unit/docker_provider_test.ts"],
  },
  {
    name:
      "`sandbox exec --repo` shares the profile's development sandbox with every other repository",
    file: DOCKER_PROVIDER,
    find: "const repo = options.repository ? `repo-${options.repository.id}` : undefined;",
    replace: "const repo = undefined;",
    tests: ["tests/unit/docker_provider_test.ts"],
  },
  {
    name: "the /tmp and home tmpfs are larger than the memory limit",
    file: DOCKER_PROVIDER,
    find: "Math.floor(memoryBytes / 4 / 4096)",
    replace: "Math.floor(memoryBytes * 4 / 4096)",
    tests: ["tests/unit/docker_provider_test.ts"],
  },
  {
    name: "the workspace volume is created without asking for a kernel quota",
    file: DOCKER_PROVIDER,
    find: "const quota = { size: String(this.profile.resources.diskBytes) };",
    replace: "const quota = {};",
    tests: ["tests/unit/docker_provider_test.ts"],
  },
  {
    name: "the disk watch never stops a workspace growing past resources.disk",
    file: "lib/sandbox/disk_watch.ts",
    find: `report[1] === "du" && bytes > options.limitBytes && previous !== undefined &&
        bytes > previous`,
    replace: "false",
    tests: ["tests/unit/disk_watch_test.ts"],
  },
  {
    name: "the disk watch fails open when its watcher dies",
    file: "lib/sandbox/disk_watch.ts",
    find: "      const ended = await child.finished;\n      fail(",
    replace: "      const ended = await child.finished;\n      if (false) fail(",
    tests: ["tests/unit/disk_watch_test.ts"],
  },
  {
    name: "the result import reads the sandbox's pack without a cap",
    file: "lib/repo/local.ts",
    find: "        if (received > options.maxBytes) {",
    replace: "        if (false) {",
    tests: ["tests/unit/result_import_test.ts"],
  },
  {
    name: "the exec wrapper is not a subreaper (setsid and double forks escape it)",
    file: "scripts/sandbox-exec",
    find: "  prctl($PR_SET_DUMPABLE, 0);\n  prctl($PR_SET_CHILD_SUBREAPER, 1);\n",
    replace: "  prctl($PR_SET_DUMPABLE, 0);\n",
    tests: ["tests/security/leftover_processes_test.ts"],
  },
  {
    name:
      "the wrappers run on the readable perl: each is dumpable until its prctl (the agent attaches to it, or reads a waiting one's key)",
    file: "scripts/sandbox-exec",
    find: "#!/usr/local/libexec/sandbox-perl\n",
    replace: "#!/usr/bin/perl\n",
    tests: ["tests/security/leftover_processes_test.ts"],
  },
  {
    name:
      "the wrappers' interpreter is readable by the sandbox user (so they are dumpable until their prctl)",
    file: "Dockerfile",
    find: '-m 0711 "$(readlink -f /usr/bin/perl)"',
    replace: '-m 0755 "$(readlink -f /usr/bin/perl)"',
    tests: ["tests/security/leftover_processes_test.ts"],
  },
  {
    name:
      "a sweep kills an exec still starting (a command started beside another's end never runs)",
    file: "scripts/sandbox-exec",
    find: "    $keep{$_} = 1 for grep { entered($table, $_) } keys %$table;\n",
    replace: "",
    tests: ["tests/security/leftover_processes_test.ts"],
  },
  {
    name:
      "a process counts as started from outside whatever its parent (the agent's own undumpable orphans outlive every sweep)",
    file: "scripts/sandbox-exec",
    find: '  return 0 unless $ppid == 0 && $pid != 1 && $state ne "Z";\n',
    replace: '  return 0 unless $pid != 1 && $state ne "Z";\n',
    tests: ["tests/security/leftover_processes_test.ts"],
  },
  {
    name: "the sweep spares orphans",
    file: "scripts/sandbox-exec",
    find: '    $killed += kill "KILL", @targets;',
    replace: '    print "swept $killed\\n"; exit 0;',
    tests: ["tests/security/leftover_processes_test.ts"],
  },
  {
    name:
      "sandbox cp out takes any amount the sandbox sends (a file of holes fills the host's disk)",
    file: DOCKER_PROVIDER,
    find: "        if (received > limitBytes) {",
    replace: "        if (false) {",
    tests: ["tests/security/copy_out_test.ts"],
  },
  {
    name: "sandbox cp out archives holes as data",
    file: DOCKER_PROVIDER,
    find: `exec tar -C "$1" --sparse -c -- "$2"`,
    replace: `exec tar -C "$1" -c -- "$2"`,
    tests: ["tests/security/copy_out_test.ts"],
  },
  {
    name:
      "sandbox cp out accepts device and FIFO members (as plain files: the archive's word for what they are is taken)",
    file: "lib/tar_extract.ts",
    find: `const ENTRY_KINDS: Record<string, Kind> = {
  "0": "file",`,
    replace: `const ENTRY_KINDS: Record<string, Kind> = {
  "3": "file",
  "4": "file",
  "6": "file",
  "0": "file",`,
    tests: ["tests/unit/tar_extract_test.ts", "tests/security/copy_out_test.ts"],
  },
  {
    name: "sandbox cp out accepts '..' components in member names",
    file: "lib/tar_extract.ts",
    find: `if (parts.includes("..")) throw`,
    replace: `if (false) throw`,
    tests: ["tests/unit/tar_extract_test.ts"],
  },
  {
    name: "sandbox cp out keeps setuid, setgid and sticky bits",
    file: "lib/tar_extract.ts",
    find: "const PERMISSION_BITS = 0o777;",
    replace: "const PERMISSION_BITS = 0o7777;",
    tests: ["tests/unit/tar_extract_test.ts", "tests/security/copy_out_test.ts"],
  },
  {
    name:
      "the quarantine imports a .gitmodules whose entries hold control characters (a submodule path ending in a carriage return)",
    file: "lib/repo/gitmodules.ts",
    find: "      if (CONTROL.test(key) || CONTROL.test(value)) {",
    replace: "      if (false) {",
    tests: ["tests/unit/result_import_test.ts"],
  },
  {
    name:
      "the proxies' socket directory is mounted from the state directory (the sandbox's mount table shows the user's home)",
    file: "lib/sandbox/proxy_mount.ts",
    find: "  return `${PROXY_MOUNT_TMP}/sandbox-proxy-${user}/${id}`;",
    replace: "  return `${userStateDir()}/proxy/${id}`;",
    tests: ["tests/unit/proxy_mount_test.ts", "tests/security/relay_socket_test.ts"],
  },
  {
    name: "the proxies' socket directory is mounted into the sandbox writable",
    file: DOCKER_PROVIDER,
    find: "dst=${PROXY_MOUNT_PATH},readonly",
    replace: "dst=${PROXY_MOUNT_PATH}",
    tests: ["tests/unit/docker_provider_test.ts", "tests/security/relay_socket_test.ts"],
  },
  {
    name: "the directory above the sockets lets every host user through",
    file: "lib/sandbox/proxy_mount.ts",
    find: "  Deno.chmodSync(parent, 0o700);",
    replace: "  Deno.chmodSync(parent, 0o755);",
    tests: ["tests/unit/docker_provider_test.ts", "tests/security/relay_test.ts"],
  },
  {
    name:
      "the relay runs as the sandbox user (a leftover of the agent's uid can ptrace it, read its memory and token, kill it)",
    file: "lib/sandbox/docker_relay.ts",
    find: '"--interactive",\n      "--user",\n      RELAY_USER,\n',
    replace: '"--interactive",\n      "--user",\n      "10001:10001",\n',
    tests: ["tests/security/relay_uid_test.ts"],
  },
  {
    name:
      "the relay's wrapper keeps its state in the sandbox user's /tmp directory (made first, it is the relay's; an agent's plant is used)",
    file: "scripts/sandbox-exec",
    find: `my $STATE = $< == $SANDBOX_UID ? "/tmp/.sandbox-exec" : undef;`,
    replace: `my $STATE = "/tmp/.sandbox-exec";`,
    tests: ["tests/security/relay_uid_test.ts"],
  },
  {
    name: "a run's docker calls go to this machine's engine although DOCKER_HOST names another one",
    file: "lib/sandbox/engine_api.ts",
    find: `    if (host && !host.startsWith("unix://")) return undefined;\n`,
    replace: ``,
    tests: ["tests/unit/engine_api_test.ts"],
  },
  {
    name:
      "a run's docker calls go to this machine's engine although DOCKER_CONTEXT names another one",
    file: "lib/sandbox/engine_api.ts",
    find: `    if (context && context !== "default") return undefined;\n`,
    replace: ``,
    tests: ["tests/unit/engine_api_test.ts"],
  },
  {
    name:
      "a run's docker calls go to this machine's engine although the CLI's config chooses another context",
    file: "lib/sandbox/engine_api.ts",
    find: `    if (!context && !host && otherContextConfigured()) return undefined;\n`,
    replace: ``,
    tests: ["tests/unit/engine_api_test.ts"],
  },
  {
    name:
      "a claimed spare relay is taken for the relay without its key (any connection to the control socket passes)",
    file: "lib/proxy/spare_relay.ts",
    find: `if (said && sameBytes(said, expected)) {`,
    replace: `if (said) {`,
    tests: ["tests/unit/spare_relay_test.ts", "tests/security/spare_relay_test.ts"],
  },
  {
    name:
      "a spare relay that did not answer is left running (holding its ports, waiting) when the session passes it over",
    file: "lib/proxy/spare_relay.ts",
    find: `    trace("session: spare relay did not answer");\n    await stopSpare();\n`,
    replace: `    trace("session: spare relay did not answer");\n`,
    tests: ["tests/unit/spare_relay_test.ts", "tests/security/spare_relay_test.ts"],
  },
  {
    name:
      "a spare relay passed on keeps the connections it carried for the session that ended (the agent's open connection reaches the next session)",
    file: "relay/main.ts",
    find: `    for (const conn of this.#conns) close(conn);`,
    replace: ``,
    tests: ["tests/unit/spare_relay_test.ts"],
  },
  {
    name:
      "a spare relay told nothing at its session's end serves again (a session that crashed, or would not pass it on, leaves it running)",
    file: "relay/main.ts",
    find: `    if (!again) Deno.exit(0);`,
    replace: ``,
    tests: ["tests/unit/spare_relay_test.ts"],
  },
  {
    name:
      "a claimed pooled container stays on offer (it is copied to claimed, not moved): it serves a second run",
    file: "lib/sandbox/pool_records.ts",
    find:
      "await Deno.rename(\n      `${poolDir()}/ready/${name}.json`,\n      `${poolDir()}/claimed/",
    replace:
      "await Deno.copyFile(\n      `${poolDir()}/ready/${name}.json`,\n      `${poolDir()}/claimed/",
    tests: ["tests/unit/pool_records_test.ts"],
  },
  {
    name:
      "a pool claim that is not atomic (looked at, then taken): two runs at once win the same container",
    file: "lib/sandbox/pool_records.ts",
    find:
      "    await Deno.rename(\n      `${poolDir()}/ready/${name}.json`,\n      `${poolDir()}/claimed/${claimedName(name, await self())}`,\n    );",
    replace:
      '    await Deno.stat(`${poolDir()}/ready/${name}.json`);\n    await new Promise((r) => setTimeout(r, 300));\n    await Deno.writeTextFile(`${poolDir()}/claimed/${claimedName(name, await self())}`, "");\n    await Deno.remove(`${poolDir()}/ready/${name}.json`).catch(() => {});',
    tests: ["tests/unit/pool_records_test.ts"],
  },
  {
    name:
      "a run's container is kept after the run: what its agent left (a spy, a squatter) lives on",
    file: "lib/run/run.ts",
    find: "  if (!keep.worktree && !keep.branch) return await sandbox.release();",
    replace: "  if (!keep.worktree && !keep.branch) return;",
    tests: ["tests/security/cross_run_test.ts"],
  },
  {
    name:
      "releasing a Docker run sandbox leaves it running (its container, volume and host records stay for the next acquire to meet)",
    file: "lib/sandbox/docker_lifecycle.ts",
    find: "    return destroy(this.provider);",
    replace: "    return Promise.resolve();",
    tests: ["tests/conformance/docker_test.ts"],
  },
  {
    name: "the repository's object cache is mounted writable into a run's container",
    file: DOCKER_PROVIDER,
    find: "dst=${CACHE_DIR},readonly`",
    replace: "dst=${CACHE_DIR}`",
    tests: ["tests/security/cross_run_test.ts"],
  },
  {
    name:
      "a reused pid passes for the holder of a run's container (the container of a killed CLI is never reaped)",
    file: "lib/sandbox/pool_records.ts",
    find: "return await processStartTicks(held.pid) === held.startTicks;",
    replace: "return await processStartTicks(held.pid) !== undefined;",
    tests: ["tests/unit/pool_records_test.ts"],
  },
  {
    name:
      "our own programs in the sandbox inherit the container's environment (a repository's NODE_OPTIONS or DENO_* steers the worker and the relay)",
    file: "scripts/sandbox-exec",
    find: '  return unless $command[0] eq "deno" && grep { $_ =~ $OWN_PROGRAM } @command;',
    replace: "  return;",
    tests: ["tests/security/own_environment_test.ts"],
  },
  {
    name: "the container's init does not watch the workspace (the disk limit rests on nothing)",
    file: "scripts/sandbox-exec",
    find: `  disk_watch("/workspace", "du ", sub { select(undef, undef, undef, $_[0]) });`,
    replace: `  sleep 3600 while 1;`,
    tests: ["tests/security/disk_watch_attack_test.ts"],
  },
  {
    name:
      "a disk watch that falls silent is never noticed (a stopped watcher lets the workspace fill)",
    file: "lib/sandbox/disk_watch.ts",
    find: "silence = setTimeout(() => {",
    replace: "silence = setTimeout(() => { return;",
    tests: ["tests/unit/disk_watch_test.ts"],
  },
  {
    name:
      "a run's liveness is judged by its pid alone (a reused pid makes a crashed run read as running)",
    file: "lib/run/liveness.ts",
    find: "return await isSameProcessAlive(meta.pid, meta.pidStartTicks);",
    replace: "return await isSameProcessAlive(meta.pid);",
    tests: ["tests/unit/run_liveness_test.ts", "tests/e2e/dead_run_liveness_test.ts"],
  },
  {
    name:
      "a run record without its process's start time is judged by the pid alone (a reused pid keeps a dead run running and logs -f hanging)",
    file: "lib/run/liveness.ts",
    find: "return started <= Date.parse(meta.startedAt) + BOOT_TIME_SLACK_MS;",
    replace: "return true;",
    tests: ["tests/e2e/dead_run_liveness_test.ts"],
  },
  {
    name:
      "the reaper removes a killed run's container with its work (the agent's commits are lost)",
    file: "lib/sandbox/pool.ts",
    find: '    if (await recoverOrphan(profile, held) !== "remove") continue;',
    replace: "",
    tests: ["tests/security/killed_run_recovery_test.ts"],
  },
  {
    name:
      "a killed run's branch is brought back over a branch of that name the user made meanwhile (fast-forwarding it)",
    file: "lib/run/recover.ts",
    find: "    await checkRunBranch(local, note.branch);",
    replace: "",
    tests: ["tests/security/killed_run_recovery_test.ts"],
  },
  {
    name:
      "a killed run's branch skips the quarantine's .gitmodules check (a submodule path ending in a CR comes in)",
    file: "lib/repo/local.ts",
    find: "    await assertPlainGitmodules(quarantine, head, worktree.base, options.signal);",
    replace: "",
    tests: ["tests/security/killed_run_recovery_test.ts"],
  },
  {
    name:
      "Claude Code reads the project's settings untrusted (the project setting source left on: its hooks, env and apiKeyHelper run)",
    file: "lib/agents/launch.ts",
    find: `const sources = trusted.has(".claude") ? [] : ["--setting-sources", "user"];`,
    replace: `const sources: string[] = [];`,
    tests: ["tests/unit/agent_launch_test.ts", "tests/security/agent_project_config_test.ts"],
  },
  {
    name: "Claude Code starts the project's MCP servers untrusted (no --strict-mcp-config)",
    file: "lib/agents/launch.ts",
    find: `if (!trusted.has(".mcp.json")) return [...sources, "--strict-mcp-config"];`,
    replace: `if (!trusted.has(".mcp.json")) return sources;`,
    tests: ["tests/unit/agent_launch_test.ts"],
  },
  {
    name:
      "Codex is told the project is trusted whatever the user trusted (its .codex/ config and MCP servers load)",
    file: "lib/agents/launch.ts",
    find: `trust_level="\${
    trusted ? "trusted" : "untrusted"
  }"`,
    replace: `trust_level="trusted"`,
    tests: ["tests/unit/agent_launch_test.ts", "tests/security/agent_project_config_test.ts"],
  },
  {
    name:
      "agent configuration is used without checking the user's trust (every committed file counts as trusted)",
    file: "lib/agents/project_config.ts",
    find: `if (state !== "trusted") {
      ignored.push(`,
    replace: `if (state === "never") {
      ignored.push(`,
    tests: [
      "tests/unit/agent_project_config_test.ts",
      "tests/security/agent_project_config_test.ts",
    ],
  },
  {
    name: "agent configuration that is not a regular file (a symbolic link) counts as trusted",
    file: "lib/agents/project_config.ts",
    find: `const ignored: IgnoredAgentFile[] = files.filter((f) => !regular.includes(f)).map(`,
    replace:
      `const ignored: IgnoredAgentFile[] = files.filter((f) => !regular.includes(f) && false).map(`,
    tests: ["tests/unit/agent_project_config_test.ts"],
  },
  {
    name:
      "a devcontainer's containerEnv/remoteEnv sets loader and interpreter variables (PERL5OPT, LD_PRELOAD…)",
    file: "lib/sandbox/devcontainer/runtime.ts",
    find: `const refused = value === null ? undefined : refusedEnvReason(name);`,
    replace: `const refused = value === null ? undefined : undefined;`,
    tests: ["tests/unit/refused_env_test.ts", "tests/security/devcontainer_hostile_test.ts"],
  },
  {
    name:
      "a profile's environment.set/passthrough keeps loader and interpreter variables (no warning)",
    file: CONFIG,
    find: `const environment = withoutRefusedNames(chosen, profile.sandbox.environment);`,
    replace:
      `const environment = { environment: profile.sandbox.environment, warnings: [] as string[] };`,
    tests: ["tests/unit/refused_env_test.ts"],
  },
  {
    name:
      "the container's environment keeps loader and interpreter variables of a profile made without resolveProfile()",
    file: DOCKER_PROVIDER,
    find:
      `return withoutRefusedEnv({ ...env, ...this.profile.sandbox.environment.set }, (name) => name)
      .env;`,
    replace: `return { ...env, ...this.profile.sandbox.environment.set };`,
    tests: ["tests/unit/refused_env_test.ts"],
  },
  ...["LD_*", "PERL*", "NODE_*", "DENO_*", "GIT_*"].map((family) => ({
    name: `the refused environment names without ${family}`,
    file: "lib/refused_env.ts",
    find: `names: ["${family}"`,
    replace: `names: ["NOT-${family}"`,
    tests: ["tests/unit/refused_env_test.ts"],
  })),
  {
    name:
      "YAML aliases expand without bound (an alias bomb in a project's sandbox.yaml grows the CLI without limit)",
    file: "lib/yaml.ts",
    find: `doc.toJS({ maxAliasCount: MAX_YAML_ALIAS_COUNT })`,
    replace: `doc.toJS({ maxAliasCount: -1 })`,
    tests: ["tests/unit/input_file_test.ts"],
  },
  {
    name:
      "a configuration file is read whatever its size (a project's sandbox.yaml of gigabytes is read whole)",
    file: CONFIG,
    find: `const read = await readBounded(file, MAX_CONFIG_BYTES);`,
    replace: `const read = await readBounded(file, Number.MAX_SAFE_INTEGER);`,
    tests: ["tests/unit/input_file_test.ts"],
  },
  {
    name:
      "a host lock counts on a file its last holder removed (two holders at once: one on the removed file, one on the new)",
    file: "lib/lock.ts",
    find: `      if (await isAtPath(file, lockPath(name))) return file;`,
    replace: `      return file;`,
    tests: ["tests/unit/lock_test.ts"],
  },
  {
    name: "MCP file tools use any path the client names (no check that it stays in the checkout)",
    file: MCP_CONFINE,
    find: `'case "$r" in "$root"|"$root"/*) ;; *) exit 92 ;; esac; '`,
    replace: `''`,
    tests: MCP_TESTS,
    filter: "file tools refuse",
  },
  {
    name:
      "MCP file tools check the path without following symlinks (a symlink made in the checkout leads out)",
    file: MCP_CONFINE,
    find: `'r=$(realpath -m -- "$p") || exit 91; '`,
    replace: `'r=$(realpath -m -s -- "$p") || exit 91; '`,
    tests: MCP_TESTS,
    filter: "file tools refuse",
  },
  {
    name: "sandbox mcp does not notice the client vanish (its sandboxes stay while it waits)",
    file: "lib/mcp/server.ts",
    find: `const gone = () => resolve("the MCP client disconnected");`,
    replace: `const gone = () => {};`,
    tests: MCP_TESTS,
    filter: "mid-command",
  },
  {
    name: "sandbox mcp ends without destroying its environments' sandboxes",
    file: "lib/mcp/server.ts",
    find: `environment.close({ status: "interrupted", content: reason })`,
    replace: `Promise.resolve()`,
    tests: MCP_TESTS,
    filter: "mid-command",
  },
  {
    name:
      "sandbox mcp ends an environment without releasing its sandbox (mode local: its directory stays)",
    file: "lib/mcp/environment.ts",
    find: `context.cleanups.push(() => sandbox.release());`,
    replace: `context.cleanups.push(() => Promise.resolve());`,
    tests: ["tests/e2e/mcp_local_test.ts"],
    filter: "vanishing",
  },
  {
    name: "a run goes on in a namespace whose sandbox NetworkPolicy is weaker than deny-all",
    file: "lib/sandbox/kubernetes/lifecycle.ts",
    find: "    if (deniesAll(found)) return;\n",
    replace: "    return;\n",
    tests: ["tests/unit/kubernetes_pod_spec_test.ts"],
  },
  ...KUBERNETES_POD_RULES,
  {
    name: "a run uses the pod an agent-sandbox claim bound even when it is not the hardened pod",
    file: "lib/sandbox/kubernetes/lifecycle.ts",
    find: "      if (mismatch) {\n",
    replace: "      if (mismatch && false) {\n",
    tests: ["tests/security/kubernetes_agent_sandbox_test.ts"],
  },
  {
    name: "a pod exec carries a known secret in its environment or argv",
    file: "lib/sandbox/kubernetes/provider.ts",
    find: `      envKind: "exec environment",
      argv,
    });`,
    replace: `      envKind: "exec environment",
      argv: [],
    } && {});`,
    tests: ["tests/security/kubernetes_secret_guard_test.ts"],
  },
  {
    name: "a file written into a pod carries a known secret",
    file: "lib/sandbox/kubernetes/provider.ts",
    find: `    assertNoSecrets(\`pod "\${this.podName}"\`, { file: { path, data } });\n`,
    replace: "",
    tests: ["tests/security/kubernetes_secret_guard_test.ts"],
  },
  {
    name: "the SandboxTemplate leaves its pods' network to agent-sandbox's managed policy",
    file: "lib/sandbox/kubernetes/agent_sandbox.ts",
    find: `networkPolicyManagement: "Unmanaged",`,
    replace: `networkPolicyManagement: "Managed",`,
    tests: ["tests/security/kubernetes_agent_sandbox_test.ts"],
  },
  ...BUDGET_MUTATIONS,
  ...SECRET_NAME_RULES,
  ...DOCTOR_MUTATIONS,
  ...LOCAL_MUTATIONS,
  {
    name: "the host's fetch of a remote carries the credential on git's command line",
    file: "lib/repo/remote_mirror.ts",
    find: `"fetch",
      "-q",`,
    replace:
      `...(env.GIT_CONFIG_VALUE_2 ? ["-c", \`http.extraHeader=\${env.GIT_CONFIG_VALUE_2}\`] : []),
      "fetch",
      "-q",`,
    tests: ["tests/unit/remote_mirror_test.ts"],
  },
  {
    name: "the host's fetch of a remote follows redirects (its credential header with them)",
    file: "lib/repo/remote_mirror.ts",
    find: `["http.followRedirects", "false"],`,
    replace: `["http.followRedirects", "true"],`,
    tests: ["tests/security/remote_redirect_test.ts"],
  },
  {
    name: "a session's directory is open to every user (its viewers' socket takes keystrokes)",
    file: "lib/session/protocol.ts",
    find: "export const SESSION_DIR_MODE = 0o700;",
    replace: "export const SESSION_DIR_MODE = 0o755;",
    tests: ["tests/security/session_socket_test.ts"],
  },
  {
    name: "a session's viewers' socket is writable by every user",
    file: "lib/session/protocol.ts",
    find: "export const VIEWERS_SOCKET_MODE = 0o600;",
    replace: "export const VIEWERS_SOCKET_MODE = 0o666;",
    tests: ["tests/security/session_socket_test.ts"],
  },
  {
    name: "subscription: the proxy sends Claude's OAuth token as x-api-key, without the OAuth flag",
    file: CREDENTIAL_PROXY,
    find: `} else if (options.provider.auth === "oauth") {`,
    replace: `} else if (options.provider.auth === "oauth" && false) {`,
    tests: CREDENTIAL_TESTS,
  },
  {
    name: "subscription: a terminal session's exec passes a host secret into the sandbox unchecked",
    file: "lib/sandbox/docker_tty.ts",
    find:
      'assertNoSecrets(`sandbox "${request.container}"`, { env: request.env, argv: request.argv });',
    replace: "",
    tests: ["tests/unit/tty_exec_test.ts"],
  },
  {
    name:
      "subscription: Claude Code's TUI is given the host's subscription token, not the placeholder",
    file: "lib/agents/interactive.ts",
    find: "env: { ...CLAUDE_QUIET_ENV, ANTHROPIC_AUTH_TOKEN: token },",
    replace:
      'env: { ...CLAUDE_QUIET_ENV, ANTHROPIC_AUTH_TOKEN: Deno.env.get("CLAUDE_CODE_OAUTH_TOKEN") ?? token },',
    tests: ["tests/security/subscription_token_test.ts"],
  },
  {
    name:
      "Codex's TUI gets no projects table: what the agent writes in ~/.codex decides whether the repository's .codex/ loads",
    file: "lib/agents/interactive.ts",
    find: "      modelFor(input),\n      ...codexProjectFlags(input),\n",
    replace: "      modelFor(input),\n",
    tests: ["tests/unit/agent_interactive_test.ts"],
  },
  {
    name: "Codex's TUI is given the host's API key, not the placeholder",
    file: "lib/agents/interactive.ts",
    find: "env: { CODEX_HOME },",
    replace: 'env: { CODEX_HOME, SANDBOX_LLM_TOKEN: Deno.env.get("OPENAI_API_KEY") ?? "" },',
    tests: ["tests/security/codex_tui_key_test.ts"],
  },
  {
    name:
      "a filler does not count what other processes are starting for the pool (two ups at once make it twice)",
    file: "lib/sandbox/pool.ts",
    find: "const missing = profile.sandbox.pool - ready - (await startingFor(key)).length;",
    replace: "const missing = profile.sandbox.pool - ready;",
    tests: ["tests/e2e/pool_test.ts"],
  },
  {
    name: "up returns while other processes are still starting the pool's containers",
    file: "lib/sandbox/pool.ts",
    find: "if (!options.wait || (await startingFor(key)).length === 0) return started;",
    replace: "return started;",
    tests: ["tests/e2e/pool_test.ts"],
  },
  {
    name: "up keeps offering a pooled container that runs no command (a run that claims it waits)",
    file: "lib/sandbox/pool.ts",
    find: `options.probe && await isWedged(provider, options.signal)`,
    replace: `false`,
    tests: ["tests/e2e/pool_test.ts"],
  },
  {
    name: "doctor: a setsid child alive after its command ended is not looked for",
    file: "lib/doctor/doctor.ts",
    find: `aliveAfterCommand: observed.survivorAfterCommand !== "",`,
    replace: `aliveAfterCommand: false,`,
    tests: ["tests/security/doctor_weakened_test.ts"],
  },
  {
    name: "doctor: a write past resources.disk that ran to its end is read as stopped",
    file: "lib/doctor/doctor.ts",
    find: `attackCompleted: disk.attack.completed,`,
    replace: `attackCompleted: false,`,
    tests: ["tests/security/doctor_weakened_test.ts"],
  },
  {
    name:
      "doctor: no_new_privs is taken as set whatever the sandbox says (setuid programs ignored)",
    file: "lib/doctor/doctor.ts",
    find: `noNewPrivs: field("NoNewPrivs")[0] === "1",`,
    replace: `noNewPrivs: true,`,
    tests: ["tests/security/doctor_weakened_test.ts"],
  },
  {
    name: "doctor: a devcontainer profile is checked on the default image, not its devcontainer's",
    file: "lib/doctor/doctor.ts",
    find: `    target = opened.profile;`,
    replace: `    target = { ...profile, sandbox: { ...profile.sandbox, mode: "container" } };`,
    tests: ["tests/security/doctor_devcontainer_test.ts"],
  },
  {
    name: "doctor: a probe with no HTTP status (no curl) is read as let through the allowlist",
    file: "lib/doctor/doctor.ts",
    find: `denied !== undefined && /^\\d{3}$/.test(denied.code) &&`,
    replace: `denied !== undefined &&`,
    tests: ["tests/security/doctor_devcontainer_test.ts"],
  },
  {
    name: "doctor: its sandbox is made through docker on PATH, not the client the caller gave",
    file: "lib/doctor/doctor.ts",
    find: `    pooled: false,
    docker: options.docker,`,
    replace: `    pooled: false,`,
    tests: ["tests/security/doctor_weakened_test.ts"],
  },
  {
    name: "mode local: a command inherits the host process's open descriptors",
    file: LOCAL_LAUNCHER,
    find: "if (syscall(436, 3, 0xffffffff, 0) != 0) {",
    replace: "if (0) {",
    tests: ["tests/security/local_mode_test.ts"],
    filter: "descriptor the host process leaves",
  },
  {
    name: "mode local: sandbox exec's kept home is the user's own home",
    file: "lib/sandbox/local/dev_sandbox.ts",
    find: "const kept = { workspace: `${dir}/workspace`, home: `${dir}/home` };",
    replace: 'const kept = { workspace: `${dir}/workspace`, home: Deno.env.get("HOME")! };',
    tests: ["tests/e2e/local_exec_test.ts"],
    filter: "cannot read a file of the user's home",
  },
  {
    name: "mode local: host sysctls writable from a sandbox root made (no read-only /proc entries)",
    file: LOCAL_BWRAP,
    find: "    ...READ_ONLY_PROC.flatMap(",
    replace: "    ...([] as string[]).flatMap(",
    tests: ["tests/security/local_mode_test.ts"],
    filter: "host sysctls and device nodes are read-only",
  },
  {
    name:
      "mode local: the host's device nodes changeable from a sandbox root made (not remounted read-only)",
    file: LOCAL_BWRAP,
    find: 'return [PERL, "-e", program, ...devices];',
    replace: 'return [PERL, "-e", program];',
    tests: ["tests/security/local_mode_test.ts"],
    filter: "host sysctls and device nodes are read-only",
  },
  {
    name: "mode local: AF_VSOCK sockets allowed (the host's and the hypervisor's ports)",
    file: "lib/sandbox/local/seccomp.ts",
    find: "export const REFUSED_SOCKET_FAMILIES = { AF_VSOCK: 40 } as const;",
    replace: "export const REFUSED_SOCKET_FAMILIES = {} as const;",
    tests: ["tests/security/local_mode_test.ts"],
    filter: "AF_VSOCK",
  },
  {
    name: "mode local: io_uring allowed (operations no seccomp filter sees)",
    file: "lib/sandbox/local/seccomp.ts",
    find: '  "io_uring_setup",\n  "io_uring_enter",',
    replace: '  "io_uring_enter",',
    tests: ["tests/security/local_mode_test.ts"],
    filter: "AF_VSOCK",
  },
  {
    name: 'mode local: the launcher reads a process\'s start after the first ") " of its stat',
    file: LOCAL_LAUNCHER,
    find: "my @fields = split / /, (<$stat> =~ /.*\\\\) (.*)/s)[0];",
    replace: "my @fields = split / /, (<$stat> =~ /\\\\) (.*)/)[0];",
    tests: ["tests/security/local_mode_test.ts"],
    filter: "whatever its name",
  },
  {
    name:
      "mode local: the disk watch counts the checkout alone (/tmp and home fill the host's disk)",
    file: "lib/sandbox/local/lifecycle.ts",
    find: "        workspace,\n        home,\n        tmp,",
    replace: "        workspace,",
    tests: ["tests/security/local_mode_test.ts"],
    filter: "resources.disk in the sandbox's /tmp",
  },
  {
    name: "mode local: a command's environment rides on its launcher's command line",
    file: LOCAL_LAUNCHER,
    find: "  return { argv, env };",
    replace: "  return { argv: [...argv, ...Object.values(env)], env };",
    tests: ["tests/security/local_mode_test.ts"],
    filter: "on no command line of the host",
  },
  {
    name: "mode local: sandbox exec runs its command with no sandbox of its own",
    file: "lib/sandbox/local/local_sandbox.ts",
    find: "    return launcherCommand({\n      perl: this.tools.perl,",
    replace:
      "    return { argv: argv.slice(), env: { ...env } };\n    return launcherCommand({\n      perl: this.tools.perl,",
    tests: ["tests/e2e/local_exec_test.ts"],
    filter: "cannot read a file of the user's home",
  },
  {
    name: "mode local: a sandbox's directories the agent locked are not mended before removal",
    file: LOCAL_SANDBOX,
    find: '    await run(["chmod", "-R", "u+rwX", "--", root]);\n',
    replace: "",
    tests: ["tests/security/local_user_test.ts"],
  },
  {
    name: "prune --images removes agent files and bundles while a mode local sandbox binds them",
    file: "cli/runs_commands.ts",
    find: "      const live = opts.images ? await liveLocalSandboxNames() : [];",
    replace: "      const live: string[] = [];",
    tests: ["tests/e2e/prune_test.ts"],
    filter: "sandbox prune --images",
  },
];
