/**
 * agent-sandbox on the tests' API server (tests/_kube_api.ts): its resources (`SandboxTemplate`,
 * `SandboxWarmPool`, `SandboxClaim` in extensions.agents.x-k8s.io/v1beta1, `Sandbox` in
 * agents.x-k8s.io/v1beta1) as REST, and its controllers as the scripted upstream, after
 * kubernetes-sigs/agent-sandbox at 2fd412d5:
 *
 * - extensions/controllers/sandboxwarmpool_controller.go: a pool keeps `spec.replicas` Sandboxes
 *   named `POOL-xxxxx` from its template, labelled `agents.x-k8s.io/warm-pool-sandbox`; with
 *   `updateStrategy: Recreate` an unclaimed Sandbox of an older template is deleted and replaced;
 *   `status.replicas`/`readyReplicas`.
 * - extensions/controllers/sandboxclaim_controller.go: a claim adopts a Ready warm Sandbox (else a
 *   not-yet-Ready one, else creates one named as the claim, cold): the warm-pool label goes, the
 *   claim owns it, its annotation `agents.x-k8s.io/pod-name` names its pod, the pod gets the
 *   label `agents.x-k8s.io/claim-uid` and the claim's `additionalPodMetadata`; the claim's
 *   `status.sandbox.name` and its `Ready` condition (the Sandbox's, forwarded).
 * - controllers/sandbox_controller.go: a Sandbox runs one pod of its name from its pod template;
 *   `Ready` is True (`DependenciesReady`) once the pod runs.
 * - extensions/controllers/sandboxtemplate_controller.go, sandboxtemplate_types.go: a template
 *   whose `networkPolicyManagement` is not `Unmanaged` gets a shared NetworkPolicy for its pods,
 *   by default allowing egress to the public internet (modelled: any address but RFC 1918).
 * - Deleting a claim deletes its Sandbox and the Sandbox's pod (owner references, the garbage
 *   collector), at once here.
 *
 * The controllers act on every request to these groups and after every pod start, as a
 * reconcile loop would: a claim is bound by the time a client reads it after its pod runs.
 */
import type { V1NetworkPolicy, V1Pod } from "@kubernetes/client-node";

export const GROUPS = {
  extensions: "extensions.agents.x-k8s.io",
  sandboxes: "agents.x-k8s.io",
} as const;
const WARM_POOL_LABEL = "agents.x-k8s.io/warm-pool-sandbox";
const POD_NAME = "agents.x-k8s.io/pod-name";
const SANDBOX_NAME = "agents.x-k8s.io/sandbox-name";
const CLAIM_UID = "agents.x-k8s.io/claim-uid";
const TEMPLATE_HASH = "agents.x-k8s.io/sandbox-template-hash";
const TEMPLATE_REF = "agents.x-k8s.io/sandbox-template-ref-hash";
const LAUNCH_TYPE = "agents.x-k8s.io/launch-type";

// deno-lint-ignore no-explicit-any
export type Obj = Record<string, any>;

/** What the agent-sandbox part needs of the API server: its pods. */
export interface PodHost {
  pods: Map<string, V1Pod>;
  policies: Map<string, V1NetworkPolicy>;
  createPod(body: V1Pod): void;
  deletePod(name: string): Promise<void>;
  nextVersion(): string;
}

function condition(ready: boolean, reason: string) {
  return {
    type: "Ready",
    status: ready ? "True" : "False",
    reason,
    message: ready ? "" : "Pod is not ready",
    lastTransitionTime: new Date().toISOString(),
  };
}

export class AgentSandboxApi {
  /** Each plural's objects by name. */
  readonly objects = new Map<string, Map<string, Obj>>(
    ["sandboxtemplates", "sandboxwarmpools", "sandboxclaims", "sandboxes"].map((
      p,
    ) => [p, new Map()]),
  );
  /** Every request to the agent-sandbox groups, with its body: what the client asked for. */
  readonly requests: { method: string; path: string; query: string; body?: Obj }[] = [];
  /** Whether the cluster serves these resources (a cluster without agent-sandbox: false). */
  served = true;
  /**
   * Called with each request before it is answered: what another client (a person with
   * `kubectl edit`) does at that moment.
   */
  onRequest?: (method: string, path: string) => void;

  constructor(readonly host: PodHost) {}

  of(plural: string): Map<string, Obj> {
    return this.objects.get(plural)!;
  }

  /** `/apis/GROUP/v1beta1/namespaces/NS/PLURAL[/NAME]`, or undefined when not one of these. */
  async handle(request: Request, url: URL, status: StatusFn): Promise<Response | undefined> {
    const m = /^\/apis\/([^/]+)\/v1beta1\/namespaces\/[^/]+\/([^/]+)(?:\/([^/]+))?$/.exec(
      url.pathname,
    );
    if (!m || !Object.values(GROUPS).includes(m[1] as never)) return undefined;
    const body = ["POST", "PUT"].includes(request.method) ? await request.json() : undefined;
    this.requests.push({ method: request.method, path: url.pathname, query: url.search, body });
    const objects = this.objects.get(m[2]);
    if (!this.served || !objects) {
      return status(404, "NotFound", `the server could not find the requested resource`);
    }
    this.onRequest?.(request.method, url.pathname);
    this.reconcile();
    const response = await this.#route(request.method, m[2], m[3], body, url, status);
    this.reconcile();
    return response;
  }

  async #route(
    method: string,
    plural: string,
    name: string | undefined,
    body: Obj | undefined,
    url: URL,
    status: StatusFn,
  ): Promise<Response> {
    const objects = this.of(plural);
    if (!name && method === "GET") {
      const selector = url.searchParams.get("labelSelector");
      const items = [...objects.values()].filter((o) => selects(o.metadata?.labels, selector));
      return Response.json({ apiVersion: "v1", kind: "List", metadata: {}, items });
    }
    if (!name && method === "POST" && plural !== "sandboxes") {
      const key = body!.metadata?.name ?? "";
      if (objects.has(key)) {
        return status(409, "AlreadyExists", `${plural} "${key}" already exists`);
      }
      body!.metadata = {
        ...body!.metadata,
        uid: crypto.randomUUID(),
        resourceVersion: this.host.nextVersion(),
        creationTimestamp: new Date().toISOString(),
      };
      objects.set(key, body!);
      return Response.json(body, { status: 201 });
    }
    const found = name ? objects.get(name) : undefined;
    if (!found) return status(404, "NotFound", `${plural} "${name}" not found`);
    if (method === "GET") return Response.json(found);
    if (method === "PUT" && plural !== "sandboxes") {
      if (body!.metadata?.resourceVersion !== found.metadata.resourceVersion) {
        return status(409, "Conflict", `Operation cannot be fulfilled on ${plural} "${name}"`);
      }
      found.metadata.labels = body!.metadata?.labels ?? {};
      found.metadata.annotations = body!.metadata?.annotations ?? {};
      found.spec = body!.spec;
      found.metadata.resourceVersion = this.host.nextVersion();
      return Response.json(found);
    }
    if (method === "DELETE") {
      await this.remove(plural, name!);
      return Response.json(found);
    }
    return status(405, "MethodNotAllowed", method);
  }

  /** Delete an object and what it owns (a claim's or pool's Sandboxes, a Sandbox's pod). */
  async remove(plural: string, name: string): Promise<void> {
    const found = this.of(plural).get(name);
    if (!found) return;
    this.of(plural).delete(name);
    const sandboxes = this.of("sandboxes");
    const owned = plural === "sandboxclaims"
      ? [...sandboxes.values()].filter((s) =>
        s.metadata.ownerReferences?.some((o: Obj) => o.kind === "SandboxClaim" && o.name === name)
      )
      : plural === "sandboxwarmpools"
      ? [...sandboxes.values()].filter((s) => s.metadata.labels?.[WARM_POOL_LABEL] === name)
      : [];
    for (const sandbox of owned) await this.remove("sandboxes", sandbox.metadata.name);
    if (plural === "sandboxes") await this.host.deletePod(found.metadata.annotations?.[POD_NAME]);
  }

  /** One pass of the four controllers. */
  reconcile(): void {
    for (const template of this.of("sandboxtemplates").values()) this.#reconcileTemplate(template);
    for (const sandbox of this.of("sandboxes").values()) {
      const pod = this.host.pods.get(sandbox.metadata.annotations[POD_NAME]);
      const ready = pod?.status?.phase === "Running";
      sandbox.status = {
        conditions: [condition(ready, ready ? "DependenciesReady" : "DependenciesNotReady")],
      };
    }
    for (const claim of this.of("sandboxclaims").values()) this.#reconcileClaim(claim);
    for (const pool of this.of("sandboxwarmpools").values()) this.#reconcilePool(pool);
  }

  #reconcileTemplate(template: Obj): void {
    const name = `${template.metadata.name}-network-policy`;
    if (template.spec?.networkPolicyManagement === "Unmanaged") {
      this.host.policies.delete(name);
      return;
    }
    this.host.policies.set(name, {
      apiVersion: "networking.k8s.io/v1",
      kind: "NetworkPolicy",
      metadata: { name },
      spec: {
        podSelector: { matchLabels: { [TEMPLATE_REF]: template.metadata.name } },
        policyTypes: ["Ingress", "Egress"],
        ingress: [],
        egress: template.spec?.networkPolicy?.egress ?? [{
          to: [{
            ipBlock: {
              cidr: "0.0.0.0/0",
              except: ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16"],
            },
          }],
        }],
      },
    });
  }

  #reconcileClaim(claim: Obj): void {
    const sandboxes = this.of("sandboxes");
    let name: string | undefined = claim.status?.sandbox?.name;
    if (!name) {
      const pool = this.of("sandboxwarmpools").get(claim.spec?.warmPoolRef?.name);
      const template = this.of("sandboxtemplates").get(pool?.spec?.sandboxTemplateRef?.name);
      if (!pool || !template) {
        claim.status = { conditions: [condition(false, "TemplateNotFound")] };
        return;
      }
      const members = [...sandboxes.values()].filter((s) =>
        s.metadata.labels?.[WARM_POOL_LABEL] === pool.metadata.name
      );
      const adopted = members.find((s) => isReady(s)) ?? members[0];
      const labels = {
        ...claim.spec?.additionalPodMetadata?.labels,
        [CLAIM_UID]: claim.metadata.uid,
      };
      if (adopted) {
        delete adopted.metadata.labels[WARM_POOL_LABEL];
        adopted.metadata.labels[LAUNCH_TYPE] = "warm";
        adopted.metadata.ownerReferences = [ownedBy(claim)];
        const pod = this.host.pods.get(adopted.metadata.annotations[POD_NAME]);
        if (pod) pod.metadata!.labels = { ...pod.metadata!.labels, ...labels };
        name = adopted.metadata.name;
      } else {
        name = claim.metadata.name as string;
        this.#createSandbox(name, template, { labels, owner: ownedBy(claim) });
      }
      claim.metadata.annotations = { ...claim.metadata.annotations, [SANDBOX_NAME]: name };
    }
    const sandbox = sandboxes.get(name!);
    const ready = sandbox ? isReady(sandbox) : false;
    claim.status = {
      conditions: [
        condition(
          ready,
          !sandbox ? "SandboxMissing" : ready ? "DependenciesReady" : "SandboxNotReady",
        ),
      ],
      sandbox: { name },
    };
  }

  #reconcilePool(pool: Obj): void {
    const template = this.of("sandboxtemplates").get(pool.spec?.sandboxTemplateRef?.name);
    if (!template) return;
    const hash = JSON.stringify(template.spec);
    let members = [...this.of("sandboxes").values()].filter((s) =>
      s.metadata.labels?.[WARM_POOL_LABEL] === pool.metadata.name
    );
    // Removals below run behind this pass (the objects go at once, their containers after), as a
    // controller's deletes complete after its reconcile returns.
    if (pool.spec?.updateStrategy?.type === "Recreate") {
      for (const stale of members.filter((s) => s.metadata.annotations[TEMPLATE_HASH] !== hash)) {
        void this.remove("sandboxes", stale.metadata.name);
      }
      members = members.filter((s) => s.metadata.annotations[TEMPLATE_HASH] === hash);
    }
    const replicas = pool.spec?.replicas ?? 1;
    for (const extra of members.slice(replicas)) void this.remove("sandboxes", extra.metadata.name);
    for (let count = members.length; count < replicas; count++) {
      const name = `${pool.metadata.name}-${crypto.randomUUID().slice(0, 5)}`;
      this.#createSandbox(name, template, { poolLabel: pool.metadata.name });
    }
    const now = members.slice(0, replicas);
    pool.status = {
      replicas: Math.max(now.length, replicas),
      readyReplicas: now.filter((s) => isReady(s)).length,
      selector: `${WARM_POOL_LABEL}=${pool.metadata.name}`,
    };
  }

  /** A Sandbox of `template` named `name`, and its pod of the same name. */
  #createSandbox(
    name: string,
    template: Obj,
    shape: { poolLabel?: string; owner?: Obj; labels?: Record<string, string> },
  ): void {
    const podTemplate = structuredClone(template.spec.podTemplate);
    this.of("sandboxes").set(name, {
      apiVersion: `${GROUPS.sandboxes}/v1beta1`,
      kind: "Sandbox",
      metadata: {
        name,
        uid: crypto.randomUUID(),
        resourceVersion: this.host.nextVersion(),
        labels: shape.poolLabel
          ? { [WARM_POOL_LABEL]: shape.poolLabel }
          : { [LAUNCH_TYPE]: "cold" },
        annotations: { [POD_NAME]: name, [TEMPLATE_HASH]: JSON.stringify(template.spec) },
        ownerReferences: shape.owner ? [shape.owner] : [],
      },
      spec: { podTemplate },
      status: { conditions: [condition(false, "DependenciesNotReady")] },
    });
    this.host.createPod({
      apiVersion: "v1",
      kind: "Pod",
      metadata: {
        name,
        labels: {
          ...podTemplate.metadata?.labels,
          ...shape.labels,
          [TEMPLATE_REF]: template.metadata.name,
        },
      },
      spec: podTemplate.spec,
    });
  }
}

type StatusFn = (code: number, reason: string, message: string) => Response;

function ownedBy(claim: Obj): Obj {
  return {
    apiVersion: `${GROUPS.extensions}/v1beta1`,
    kind: "SandboxClaim",
    name: claim.metadata.name,
    uid: claim.metadata.uid,
    controller: true,
  };
}

function isReady(sandbox: Obj): boolean {
  return sandbox.status?.conditions?.some((c: Obj) => c.type === "Ready" && c.status === "True");
}

function selects(labels: Record<string, string> | undefined, selector: string | null): boolean {
  if (!selector) return true;
  return selector.split(",").every((term) => {
    const [key, value] = term.split("=");
    return (labels ?? {})[key] === value;
  });
}
