/**
 * A Kubernetes API server of the tests' own, on loopback, for `@kubernetes/client-node` to talk
 * to: REST for pods, events and network policies, and pod exec over the WebSocket protocol as the
 * API specifies it (channel byte prefix: stdin 0, stdout 1, stderr 2, error 3 carrying the
 * `Status` JSON with the exit code, resize 4; in `v5.channel.k8s.io`, a client's `[255, 0]` closes
 * stdin; `v4.channel.k8s.io` where the client or the server has no v5).
 *
 * Pods are real Docker containers of the pod's image, one per pod container, the second joining
 * the first's network namespace, with the pod spec's hardening mapped to Docker's flags (user,
 * capabilities, no-new-privileges, read-only root, emptyDirs as tmpfs of their size limit,
 * memory and CPU limits). The network plugin is modelled too: a pod that a deny-all
 * NetworkPolicy selects gets no network; any other gets Docker's bridge. `enforcesPolicies: false`
 * models a plugin that ignores policies (every pod gets the bridge), and `networkPlugin` names the
 * plugin's DaemonSet in kube-system (`GET /apis/apps/v1/namespaces/kube-system/daemonsets`). The
 * server answers `GET /version`, and also listens on the Docker bridge's gateway when that address
 * is this host's: every container gets it as `KUBERNETES_SERVICE_HOST`/`_PORT`, as a kubelet
 * gives a pod the API server's service address.
 *
 * `refuse` makes it answer a request with an error (forbidden, quota exceeded); a pod whose image
 * Docker does not have stays pending with `ErrImagePull`; `unschedulable` keeps pods pending with
 * a `FailedScheduling` event. Every container it made is removed on dispose.
 */
import { bridgeHostAddress, type BridgeInspect } from "../lib/doctor/listeners.ts";
import type { V1Container, V1NetworkPolicy, V1Pod } from "@kubernetes/client-node";
import { AgentSandboxApi, GROUPS } from "./_kube_agent_sandbox.ts";

interface Refusal {
  method: string;
  path: RegExp;
  code: number;
  reason: string;
  message: string;
}

interface Event {
  involved: string;
  type: string;
  reason: string;
  message: string;
}

export interface KubeApiOptions {
  /** The exec protocols the server speaks, best first (default v5, v4). */
  protocols?: string[];
  /** Serve agent-sandbox's resources, with its controllers (tests/_kube_agent_sandbox.ts). */
  agentSandbox?: boolean;
  /** The network plugin enforces NetworkPolicy (default true). */
  enforcesPolicies?: boolean;
  /** The name of the network plugin's DaemonSet in kube-system (default `calico-node`). */
  networkPlugin?: string;
}

function status(code: number, reason: string, message: string): Response {
  return Response.json(
    { kind: "Status", apiVersion: "v1", status: "Failure", message, reason, code },
    { status: code },
  );
}

async function docker(...args: string[]): Promise<{ code: number; out: string; err: string }> {
  const result = await new Deno.Command("docker", { args, stdout: "piped", stderr: "piped" })
    .output();
  const text = (bytes: Uint8Array) => new TextDecoder().decode(bytes);
  return { code: result.code, out: text(result.stdout), err: text(result.stderr) };
}

function matches(labels: Record<string, string>, selector: string | null): boolean {
  if (!selector) return true;
  return selector.split(",").every((term) => {
    const [key, value] = term.split("=");
    return labels[key] === value;
  });
}

/** Kubernetes quantity (as the tool writes them: plain numbers, or Mi/m suffixes) to a number. */
function quantity(text: string): number {
  const m = /^(\d+(?:\.\d+)?)(Mi|Gi|Ki|m)?$/.exec(text);
  if (!m) throw new RangeError(`Unsupported quantity "${text}"`);
  const scale = { Ki: 1024, Mi: 1024 ** 2, Gi: 1024 ** 3, m: 0.001 }[m[2] ?? ""] ?? 1;
  return Number(m[1]) * scale;
}

export class KubeApiServer implements AsyncDisposable {
  readonly id = crypto.randomUUID().slice(0, 8);
  readonly pods = new Map<string, V1Pod>();
  readonly policies = new Map<string, V1NetworkPolicy>();
  readonly events: Event[] = [];
  /** Every exec's argv, as the API server received it (what an audit log would record). */
  readonly execs: string[][] = [];
  /** Every pod body as created. */
  readonly created: V1Pod[] = [];
  unschedulable = false;
  #refusals: Refusal[] = [];
  #version = 1;
  #server: Deno.HttpServer<Deno.NetAddr>;
  #protocols: string[];
  #starting = new Set<Promise<unknown>>();
  /** agent-sandbox's resources and controllers; `served` false unless asked for. */
  readonly agentSandbox: AgentSandboxApi;
  enforcesPolicies: boolean;
  networkPlugin: string;
  /** The listener on the bridge's gateway (the pods' service address), when there is one. */
  #service: Promise<Deno.HttpServer<Deno.NetAddr> | undefined>;

  constructor(options: KubeApiOptions = {}) {
    this.enforcesPolicies = options.enforcesPolicies ?? true;
    this.networkPlugin = options.networkPlugin ?? "calico-node";
    this.#protocols = options.protocols ?? ["v5.channel.k8s.io", "v4.channel.k8s.io"];
    this.agentSandbox = new AgentSandboxApi({
      pods: this.pods,
      policies: this.policies,
      createPod: (body) => void this.#createPod(body),
      deletePod: (name) => this.#deletePod(name),
      nextVersion: () => String(++this.#version),
    });
    this.agentSandbox.served = options.agentSandbox ?? false;
    this.#server = Deno.serve(
      { hostname: "127.0.0.1", port: 0, onListen: () => {} },
      (request) => this.#handle(request),
    );
    this.#service = this.#listenOnGateway();
  }

  async #listenOnGateway(): Promise<Deno.HttpServer<Deno.NetAddr> | undefined> {
    const inspected = await docker("network", "inspect", "bridge", "--format", "{{json .}}");
    if (inspected.code !== 0) return undefined;
    const gateway = bridgeHostAddress(JSON.parse(inspected.out) as BridgeInspect);
    if (!gateway) return undefined;
    return Deno.serve(
      { hostname: gateway, port: 0, onListen: () => {} },
      (request) => this.#handle(request),
    );
  }

  get url(): string {
    return `http://127.0.0.1:${this.#server.addr.port}`;
  }

  /** Answer requests of `method` to paths matching `path` with this error until told otherwise. */
  refuse(method: string, path: RegExp, code: number, reason: string, message: string): void {
    this.#refusals.push({ method, path, code, reason, message });
  }

  allow(): void {
    this.#refusals = [];
  }

  /** Write a kubeconfig for this server at `path` (context `fake`, namespace `namespace`). */
  async writeKubeconfig(path: string, namespace = "default"): Promise<void> {
    await Deno.writeTextFile(
      path,
      [
        "apiVersion: v1",
        "kind: Config",
        "clusters:",
        // Plain HTTP on loopback: the client accepts it only with TLS verification off.
        `  - name: fake\n    cluster:\n      server: ${this.url}\n      insecure-skip-tls-verify: true`,
        "users:",
        "  - name: fake\n    user:\n      token: fake-token",
        "contexts:",
        `  - name: fake\n    context:\n      cluster: fake\n      user: fake\n      namespace: ${namespace}`,
        "current-context: fake",
        "",
      ].join("\n"),
    );
  }

  /** The Docker container of pod `pod`'s container `container`. */
  containerOf(pod: string, container: string): string {
    return `kubefake-${this.id}-${pod}-${container}`;
  }

  async #handle(request: Request): Promise<Response> {
    const url = new URL(request.url);
    for (const refusal of this.#refusals) {
      if (refusal.method === request.method && refusal.path.test(url.pathname)) {
        return status(refusal.code, refusal.reason, refusal.message);
      }
    }
    if (url.pathname === "/apis") return this.#discovery();
    if (url.pathname === "/version") {
      return Response.json({ major: "1", minor: "31", gitVersion: "v1.31.0-kubefake" });
    }
    if (url.pathname === "/apis/apps/v1/namespaces/kube-system/daemonsets") {
      const items = [this.networkPlugin, "kube-proxy"].map((name) => ({
        metadata: { name, namespace: "kube-system" },
      }));
      return Response.json({ kind: "DaemonSetList", apiVersion: "apps/v1", metadata: {}, items });
    }
    const custom = await this.agentSandbox.handle(request, url, status);
    if (custom) return custom;
    const pod = /^\/api\/v1\/namespaces\/([^/]+)\/pods(?:\/([^/]+))?(?:\/(exec))?$/.exec(
      url.pathname,
    );
    if (pod?.[3]) return this.#exec(request, url, pod[2]);
    if (pod) return await this.#podRoute(request, url, pod[2]);
    const policy =
      /^\/apis\/networking\.k8s\.io\/v1\/namespaces\/([^/]+)\/networkpolicies(?:\/([^/]+))?$/
        .exec(url.pathname);
    if (policy) return await this.#policyRoute(request, policy[2]);
    if (/^\/api\/v1\/namespaces\/[^/]+\/events$/.test(url.pathname)) {
      const name = (url.searchParams.get("fieldSelector") ?? "").replace(
        "involvedObject.name=",
        "",
      );
      const items = this.events.filter((event) => event.involved === name).map((event) => ({
        metadata: { name: `${name}.${crypto.randomUUID().slice(0, 6)}` },
        involvedObject: { kind: "Pod", name },
        type: event.type,
        reason: event.reason,
        message: event.message,
      }));
      return Response.json({ kind: "EventList", apiVersion: "v1", metadata: {}, items });
    }
    return status(404, "NotFound", `the server could not find ${url.pathname}`);
  }

  async #podRoute(request: Request, url: URL, name: string | undefined): Promise<Response> {
    if (!name && request.method === "GET") {
      const selector = url.searchParams.get("labelSelector");
      const items = [...this.pods.values()].filter((pod) =>
        matches(pod.metadata?.labels ?? {}, selector)
      );
      return Response.json({ kind: "PodList", apiVersion: "v1", metadata: {}, items });
    }
    if (!name && request.method === "POST") return this.#createPod(await request.json());
    const found = name ? this.pods.get(name) : undefined;
    if (!found) return status(404, "NotFound", `pods "${name}" not found`);
    if (request.method === "GET") return Response.json(found);
    if (request.method === "PUT") {
      const body = await request.json() as V1Pod;
      if (body.metadata?.resourceVersion !== found.metadata!.resourceVersion) {
        return status(
          409,
          "Conflict",
          `Operation cannot be fulfilled on pods "${name}": the object has been modified; please apply your changes to the latest version and try again`,
        );
      }
      found.metadata!.labels = body.metadata?.labels ?? {};
      found.metadata!.annotations = body.metadata?.annotations ?? {};
      found.metadata!.resourceVersion = String(++this.#version);
      return Response.json(found);
    }
    if (request.method === "DELETE") {
      await this.#deletePod(name!);
      return Response.json(found);
    }
    return status(405, "MethodNotAllowed", request.method);
  }

  /** The API groups served (`GET /apis`): networking, and agent-sandbox's when it is installed. */
  #discovery(): Response {
    const group = (name: string, version: string) => ({
      name,
      versions: [{ groupVersion: `${name}/${version}`, version }],
      preferredVersion: { groupVersion: `${name}/${version}`, version },
    });
    const groups = [group("networking.k8s.io", "v1")];
    if (this.agentSandbox.served) {
      groups.push(group(GROUPS.extensions, "v1beta1"), group(GROUPS.sandboxes, "v1beta1"));
    }
    return Response.json({ kind: "APIGroupList", apiVersion: "v1", groups });
  }

  async #deletePod(name: string): Promise<void> {
    const found = this.pods.get(name);
    if (!found) return;
    this.pods.delete(name);
    await this.#removeContainers(found);
  }

  #createPod(body: V1Pod): Response {
    const name = body.metadata?.name ?? "";
    if (this.pods.has(name)) return status(409, "AlreadyExists", `pods "${name}" already exists`);
    this.created.push(structuredClone(body));
    body.metadata = {
      ...body.metadata,
      uid: crypto.randomUUID(),
      resourceVersion: String(++this.#version),
      creationTimestamp: new Date(),
    };
    body.status = { phase: "Pending" };
    this.pods.set(name, body);
    const starting = this.#startPod(body).catch((error) => {
      body.status = { phase: "Failed", message: String(error) };
    }).finally(() => this.agentSandbox.reconcile());
    this.#starting.add(starting);
    starting.finally(() => this.#starting.delete(starting));
    return Response.json(body, { status: 201 });
  }

  /**
   * Whether the modelled network plugin cuts `pod` off: policies add up, as Kubernetes specifies
   * them, so a pod is isolated for egress when some Egress policy selects it and no policy that
   * selects it allows anything.
   */
  #isolated(pod: V1Pod): boolean {
    if (!this.enforcesPolicies) return false;
    const labels = pod.metadata?.labels ?? {};
    const selecting = [...this.policies.values()].filter((policy) => {
      const spec = policy.spec!;
      const selector = Object.entries(spec.podSelector?.matchLabels ?? {})
        .map(([k, v]) => `${k}=${v}`).join(",");
      return matches(labels, selector || null) && (spec.policyTypes ?? []).includes("Egress");
    });
    return selecting.length > 0 &&
      selecting.every((policy) => (policy.spec!.egress ?? []).length === 0);
  }

  async #startPod(pod: V1Pod): Promise<void> {
    const name = pod.metadata!.name!;
    const spec = pod.spec!;
    if (this.unschedulable) {
      this.events.push({
        involved: name,
        type: "Warning",
        reason: "FailedScheduling",
        message: "0/3 nodes are available: 3 Insufficient memory.",
      });
      return;
    }
    const image = spec.containers[0].image!;
    if ((await docker("image", "inspect", image)).code !== 0) {
      const message = `Failed to pull image "${image}": not found`;
      pod.status = {
        phase: "Pending",
        containerStatuses: spec.containers.map((c) => ({
          name: c.name,
          image,
          imageID: "",
          ready: false,
          restartCount: 0,
          state: { waiting: { reason: "ErrImagePull", message } },
        })),
      };
      this.events.push({ involved: name, type: "Warning", reason: "Failed", message });
      return;
    }
    const network = this.#isolated(pod) ? "none" : "bridge";
    const service = (await this.#service)?.addr;
    let first: string | undefined;
    for (const container of spec.containers) {
      const args = this.#runArgs(pod, container, first ?? network, service);
      const started = await docker(...args);
      if (started.code !== 0) throw new Error(`docker run: ${started.err}`);
      first ??= `container:${this.containerOf(name, container.name)}`;
    }
    if (!this.pods.has(name)) return await this.#removeContainers(pod);
    pod.status = {
      phase: "Running",
      startTime: new Date(),
      containerStatuses: spec.containers.map((c) => ({
        name: c.name,
        image: c.image!,
        imageID: "",
        ready: true,
        restartCount: 0,
        started: true,
        state: { running: { startedAt: new Date() } },
      })),
    };
    pod.metadata!.resourceVersion = String(++this.#version);
  }

  /** `docker run` for one pod container: the pod spec's hardening as Docker flags. */
  #runArgs(
    pod: V1Pod,
    container: V1Container,
    network: string,
    service: Deno.NetAddr | undefined,
  ): string[] {
    const spec = pod.spec!;
    const security = container.securityContext ?? {};
    const volumes = new Map((spec.volumes ?? []).map((v) => [v.name, v]));
    const args = [
      "run",
      "--detach",
      "--name",
      this.containerOf(pod.metadata!.name!, container.name),
      "--label",
      `dev.sandbox.kubefake=${this.id}`,
      "--network",
      network,
    ];
    if (service) {
      args.push("--env", `KUBERNETES_SERVICE_HOST=${service.hostname}`);
      args.push("--env", `KUBERNETES_SERVICE_PORT=${service.port}`);
    }
    if (security.runAsUser !== undefined) {
      args.push("--user", `${security.runAsUser}:${security.runAsGroup ?? security.runAsUser}`);
    }
    if ((security.capabilities?.drop ?? []).includes("ALL")) args.push("--cap-drop", "ALL");
    if (security.allowPrivilegeEscalation === false) {
      args.push("--security-opt", "no-new-privileges");
    }
    if (security.readOnlyRootFilesystem) args.push("--read-only");
    for (const mount of container.volumeMounts ?? []) {
      const volume = volumes.get(mount.name);
      const size = volume?.emptyDir?.sizeLimit
        ? `,size=${quantity(volume.emptyDir.sizeLimit)}`
        : "";
      // An emptyDir is writable by the pod's fsGroup, as the kubelet makes it (Docker's tmpfs
      // ignores a mode on this image's directories: owned by the container's user instead).
      const owner = `uid=${security.runAsUser ?? 0},gid=${spec.securityContext?.fsGroup ?? 0}`;
      args.push("--tmpfs", `${mount.mountPath}:rw,exec,nosuid,nodev,${owner}${size}`);
    }
    const limits = container.resources?.limits ?? {};
    if (limits.memory) {
      args.push("--memory", String(quantity(limits.memory)));
      args.push("--memory-swap", String(quantity(limits.memory)));
    }
    if (limits.cpu) args.push("--cpus", String(quantity(limits.cpu)));
    args.push(container.image!);
    args.push(...(container.command ?? []), ...(container.args ?? []));
    return args;
  }

  async #removeContainers(pod: V1Pod): Promise<void> {
    const names = (pod.spec?.containers ?? []).map((c) =>
      this.containerOf(pod.metadata!.name!, c.name)
    );
    await docker("rm", "--force", ...names.toReversed());
  }

  async #policyRoute(request: Request, name: string | undefined): Promise<Response> {
    if (!name && request.method === "POST") {
      const body = await request.json() as V1NetworkPolicy;
      const key = body.metadata?.name ?? "";
      if (this.policies.has(key)) {
        return status(409, "AlreadyExists", `networkpolicies "${key}" already exists`);
      }
      body.metadata = { ...body.metadata, resourceVersion: String(++this.#version) };
      this.policies.set(key, body);
      return Response.json(body, { status: 201 });
    }
    const found = name ? this.policies.get(name) : undefined;
    if (!found) return status(404, "NotFound", `networkpolicies "${name}" not found`);
    if (request.method === "DELETE") this.policies.delete(name!);
    return Response.json(found);
  }

  /** Pod exec: the WebSocket stream protocol over `docker exec`. */
  #exec(request: Request, url: URL, name: string | undefined): Response {
    const pod = name ? this.pods.get(name) : undefined;
    if (!pod || pod.status?.phase !== "Running") {
      return status(404, "NotFound", `pod "${name}" is not running`);
    }
    const offered = (request.headers.get("sec-websocket-protocol") ?? "").split(",").map((p) =>
      p.trim()
    );
    const protocol = this.#protocols.find((p) => offered.includes(p));
    if (!protocol) return status(400, "BadRequest", "no supported stream protocol");
    const command = url.searchParams.getAll("command");
    const container = url.searchParams.get("container") ?? pod.spec!.containers[0].name;
    const stdin = url.searchParams.get("stdin") === "true";
    this.execs.push(command);
    // The client lists its protocols comma-separated without spaces, which Deno's own
    // negotiation does not split: the chosen one is answered here.
    const { socket, response } = Deno.upgradeWebSocket(request);
    response.headers.set("sec-websocket-protocol", protocol);
    socket.binaryType = "arraybuffer";
    socket.addEventListener("open", () => {
      const channels = {
        1: url.searchParams.get("stdout") === "true",
        2: url.searchParams.get("stderr") === "true",
      };
      streamExec(socket, protocol, channels, [
        "exec",
        ...(stdin ? ["--interactive"] : []),
        this.containerOf(name!, container),
        ...command,
      ]);
    });
    return response;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await Promise.allSettled([...this.#starting]);
    const listed = await docker(
      "ps",
      "--all",
      "--quiet",
      "--filter",
      `label=dev.sandbox.kubefake=${this.id}`,
    );
    const ids = listed.out.split("\n").filter(Boolean);
    if (ids.length) await docker("rm", "--force", ...ids);
    await (await this.#service)?.shutdown();
    await this.#server.shutdown();
  }
}

function frame(channel: number, bytes: Uint8Array): Uint8Array {
  const out = new Uint8Array(bytes.byteLength + 1);
  out[0] = channel;
  out.set(bytes, 1);
  return out;
}

/** Run `docker ARGS` and carry its stdio over `socket` in the channel protocol. */
function streamExec(
  socket: WebSocket,
  protocol: string,
  channels: Record<1 | 2, boolean>,
  args: string[],
): void {
  const child = new Deno.Command("docker", {
    args,
    stdin: args.includes("--interactive") ? "piped" : "null",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const writer = args.includes("--interactive") ? child.stdin.getWriter() : undefined;
  let stdinOpen = writer !== undefined;
  const closeStdin = () => {
    if (!stdinOpen) return;
    stdinOpen = false;
    // The command may have exited already (its stdin is then closed): nothing to end.
    writer!.close().catch(() => {});
  };
  let writes = Promise.resolve();
  socket.addEventListener("message", (event) => {
    const data = new Uint8Array(event.data as ArrayBuffer);
    if (data[0] === 0 && stdinOpen) {
      // A command that stopped reading: what the client still sends is dropped, as a pipe would.
      writes = writes.then(() => writer!.write(data.slice(1))).catch(() => {});
    } else if (data[0] === 255 && data[1] === 0 && protocol === "v5.channel.k8s.io") {
      writes = writes.then(closeStdin);
    }
  });
  socket.addEventListener("close", () => {
    if (stdinOpen) writes = writes.then(closeStdin);
    // The client went away: the exec's client process goes too (the command inside may not).
    try {
      child.kill("SIGKILL");
    } catch { /* already exited */ }
  });
  const pump = async (stream: ReadableStream<Uint8Array>, channel: 1 | 2) => {
    for await (const chunk of stream) {
      // Only the channels the client asked for: as the API server, never others.
      if (socket.readyState === WebSocket.OPEN && channels[channel]) {
        socket.send(frame(channel, chunk));
      }
    }
  };
  Promise.all([pump(child.stdout, 1), pump(child.stderr, 2), child.status]).then(([, , end]) => {
    const exit = end.signal ? 128 + 9 : end.code;
    const body = exit === 0
      ? { kind: "Status", apiVersion: "v1", metadata: {}, status: "Success" }
      : {
        kind: "Status",
        apiVersion: "v1",
        metadata: {},
        status: "Failure",
        message: `command terminated with non-zero exit code: exit status ${exit}`,
        reason: "NonZeroExitCode",
        details: { causes: [{ reason: "ExitCode", message: String(exit) }] },
      };
    if (socket.readyState === WebSocket.OPEN) {
      socket.send(frame(3, new TextEncoder().encode(JSON.stringify(body))));
      socket.close(1000);
    }
  });
}
