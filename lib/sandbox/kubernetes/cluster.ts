/**
 * The cluster a profile in mode kubernetes runs its sandboxes on: its kubeconfig (or the
 * in-cluster service account), the API clients of `@kubernetes/client-node`, and the translation
 * of what the API server answers into errors a person can act on (docs/kubernetes.md).
 */
import * as k8s from "@kubernetes/client-node";
import type { Profile } from "../../config.ts";
import { SandboxError } from "../../errors.ts";

/** The profile's `sandbox.kubernetes` block. */
export type KubernetesConfig = Profile["sandbox"]["kubernetes"];

/**
 * What the tool does on the cluster, as a Role for the namespace it uses: printed when the API
 * server refuses a request, and in docs/kubernetes.md.
 */
export const REQUIRED_ROLE = `apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: sandbox
  namespace: NAMESPACE
rules:
  - apiGroups: [""]
    resources: ["pods"]
    verbs: ["get", "list", "create", "update", "patch", "delete", "deletecollection"]
  - apiGroups: [""]
    resources: ["pods/exec"]
    verbs: ["create", "get"]
  - apiGroups: [""]
    resources: ["events"]
    verbs: ["list"]
  - apiGroups: ["networking.k8s.io"]
    resources: ["networkpolicies"]
    verbs: ["get", "create", "delete"]`;

/** One opened cluster: its API clients and where the sandboxes go. */
export interface Cluster {
  readonly config: k8s.KubeConfig;
  readonly core: k8s.CoreV1Api;
  readonly networking: k8s.NetworkingV1Api;
  readonly namespace: string;
  /** The API server's address, for messages. */
  readonly server: string;
  /** The context used ("in-cluster" for the service account). */
  readonly context: string;
}

/** The kubeconfig files `kubectl` would read: `$KUBECONFIG` (a list), else ~/.kube/config. */
async function kubeconfigFiles(): Promise<{ files: string[]; named: string }> {
  const listed = Deno.env.get("KUBECONFIG");
  const files = listed
    ? listed.split(":").filter(Boolean)
    : [`${Deno.env.get("HOME") ?? ""}/.kube/config`];
  const existing: string[] = [];
  for (const file of files) {
    if (await Deno.stat(file).then((info) => info.isFile, () => false)) existing.push(file);
  }
  return { files: existing, named: listed ? `$KUBECONFIG (${listed})` : files[0] };
}

/** Open the cluster of `profile` (mode kubernetes); a missing kubeconfig or context is a usage error. */
export async function openCluster(profile: Profile): Promise<Cluster> {
  const settings = profile.sandbox.kubernetes;
  const config = new k8s.KubeConfig();
  if (settings.in_cluster) {
    if (!Deno.env.get("KUBERNETES_SERVICE_HOST")) {
      throw new SandboxError(
        "config_invalid",
        `Profile "${profile.name}" asks for in-cluster Kubernetes access, but this process does not run in a pod`,
        { detail: `Set profiles.${profile.name}.sandbox.kubernetes.in_cluster to false` },
      );
    }
    config.loadFromCluster();
  } else {
    const { files, named } = await kubeconfigFiles();
    if (files.length === 0) {
      throw new SandboxError("config_invalid", `No kubeconfig: ${named} does not exist`, {
        detail: "Set KUBECONFIG to your cluster's kubeconfig file, or set " +
          `profiles.${profile.name}.sandbox.kubernetes.in_cluster when sandbox runs in a pod`,
      });
    }
    // Several files merge as kubectl merges them: the first file that sets a value wins.
    for (const file of files.toReversed()) config.mergeConfig(loadFile(file));
    const context = settings.context ?? config.getCurrentContext();
    if (!context || !config.getContextObject(context)) {
      throw new SandboxError(
        "config_invalid",
        `Kubernetes context "${context ?? ""}" not found in ${named}`,
        {
          detail: `Contexts there: ${config.getContexts().map((c) => c.name).join(", ") || "none"}`,
        },
      );
    }
    config.setCurrentContext(context);
  }
  const server = config.getCurrentCluster()?.server ?? "";
  return {
    config,
    core: config.makeApiClient(k8s.CoreV1Api),
    networking: config.makeApiClient(k8s.NetworkingV1Api),
    namespace: settings.namespace,
    server,
    context: settings.in_cluster ? "in-cluster" : config.getCurrentContext(),
  };
}

function loadFile(file: string): k8s.KubeConfig {
  const one = new k8s.KubeConfig();
  try {
    one.loadFromFile(file);
  } catch (error) {
    throw new SandboxError("config_invalid", `Cannot read kubeconfig "${file}": ${error}`, {
      cause: error,
    });
  }
  return one;
}

/** The HTTP status and the Kubernetes `Status` of a failed API call, when it has them. */
export function apiStatus(
  error: unknown,
): { code: number; reason?: string; message?: string } | undefined {
  if (!(error instanceof k8s.ApiException)) return undefined;
  let body: unknown = error.body;
  if (typeof body === "string") {
    try {
      body = JSON.parse(body);
    } catch {
      // Not a Status object (a proxy's HTML page): only the HTTP code is known.
      body = undefined;
    }
  }
  const status = (body ?? {}) as { reason?: unknown; message?: unknown };
  return {
    code: error.code,
    reason: typeof status.reason === "string" ? status.reason : undefined,
    message: typeof status.message === "string" ? status.message : undefined,
  };
}

/** Whether `error` is the API server's 404 (the object is gone). */
export function isNotFound(error: unknown): boolean {
  return apiStatus(error)?.code === 404;
}

/** Whether `error` is the API server's 409 (an update lost a race, or the name exists). */
export function isConflict(error: unknown): boolean {
  return apiStatus(error)?.code === 409;
}

/** `error` of an API call (`what`, e.g. `create pod "x"`) as a `SandboxError` a person can act on. */
export function clusterError(cluster: Cluster, what: string, error: unknown): SandboxError {
  if (error instanceof SandboxError) return error;
  const status = apiStatus(error);
  const where = `namespace "${cluster.namespace}" of ${cluster.server}`;
  if (!status) {
    return new SandboxError(
      "cluster_failed",
      `Cannot reach the Kubernetes API server ${cluster.server} (context "${cluster.context}") to ${what}: ${
        errorText(error)
      }`,
      { cause: error, detail: "Check that the cluster runs and that this machine can reach it" },
    );
  }
  if (status.code === 401) {
    return new SandboxError(
      "cluster_failed",
      `The Kubernetes API server ${cluster.server} did not accept the credentials of context "${cluster.context}"`,
      {
        cause: error,
        detail: "Refresh the kubeconfig's credentials (log in to the cluster again)",
      },
    );
  }
  if (status.code === 403 && /exceeded quota/i.test(status.message ?? "")) {
    return new SandboxError(
      "cluster_failed",
      `Cannot ${what} in ${where}: a ResourceQuota is exhausted: ${status.message}`,
      {
        cause: error,
        detail:
          "Wait for other pods to end, lower sandbox.pool or resources, or ask for a bigger quota",
      },
    );
  }
  if (status.code === 403) {
    return new SandboxError(
      "cluster_failed",
      `Kubernetes refused to ${what} in ${where}: forbidden: ${status.message ?? ""}`,
      {
        cause: error,
        detail: "Grant the user of the context this Role (and a RoleBinding to it):\n" +
          REQUIRED_ROLE.replace("NAMESPACE", cluster.namespace),
      },
    );
  }
  return new SandboxError(
    "cluster_failed",
    `Kubernetes could not ${what} in ${where}: ${status.code} ${status.reason ?? ""} ${
      status.message ?? ""
    }`.trimEnd(),
    { cause: error },
  );
}

function errorText(error: unknown): string {
  const cause = (error as { cause?: { code?: string; message?: string } })?.cause;
  if (cause?.code) return cause.code;
  return error instanceof Error ? error.message.split("\n")[0] : String(error);
}
