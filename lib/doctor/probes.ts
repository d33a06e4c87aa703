/**
 * The attacks `sandbox doctor` runs inside its sandbox, as the sandbox user with the session's
 * environment (what an agent has), and how their output is read. Each prints `name<TAB>fields…`
 * lines; nothing in them is trusted beyond being parsed.
 *
 * Secrets never enter the sandbox: the key search gets a fragment of the canary key base64-encoded
 * in its environment and decodes it into an unexported variable, handing it to `grep` on a file
 * descriptor, so that no environment or command line of the probe itself holds what it looks for.
 */
import type { EscalationObservation } from "./verdicts.ts";

/** Variables the probes read (values set by lib/doctor/doctor.ts). */
export const PROBE_ENV = {
  canary: "DOCTOR_CANARY_B64",
  token: "DOCTOR_TOKEN_B64",
  marker: "DOCTOR_MARKER",
  hostTargets: "DOCTOR_HOST_TARGETS",
  egressPort: "DOCTOR_EGRESS_PORT",
  target: "DOCTOR_TARGET",
} as const;

/** The name the egress twin reaches (mapped to the host's loopback in `network.hosts`). */
export const TWIN_HOST = "doctor-twin.test";
/** A name on no allowlist (`.invalid` never resolves). */
export const DENIED_HOST = "doctor-denied.invalid";

/** Read the key: every process's environment and command line, and files where tools keep things. */
const KEY_PROBE = `
part=$(printf %s "$${PROBE_ENV.canary}" | base64 -d)
token=$(printf %s "$${PROBE_ENV.token}" | base64 -d)
found() { grep -qaFf <(printf '%s\\n' "$1") "$2" 2>/dev/null; }
for d in /proc/[0-9]*; do
  for f in environ cmdline; do found "$part" "$d/$f" && printf 'key-found\\tprocess %s %s\\n' "\${d#/proc/}" "$f"; done
done
grep -rlaD skip -Ff <(printf '%s\\n' "$part") /home /tmp /workspace /opt /etc /run /var /root /usr/local 2>/dev/null | head -20 | sed 's/^/key-found\\tfile /'
found "$token" /proc/$$/environ && printf 'key-twin\\tyes\\n'
`;

/** Escalate: capabilities, setuid programs, a user namespace. */
export const ESCALATION_PROBE = `
grep -E '^(CapEff|CapPrm|NoNewPrivs):' /proc/self/status | sed 's/:[[:space:]]*/\\t/'
find / -xdev \\( -perm -4000 -o -perm -2000 \\) -type f 2>/dev/null | head -20 | sed 's/^/setuid\\t/'
if command -v unshare >/dev/null; then
  out=$(unshare -r id -u 2>&1); rc=$?
  printf 'unshare\\t%s\\t%s\\n' "$rc" "$(printf %s "$out" | tr '\\n\\t' '  ' | cut -c1-200)"
else printf 'unshare\\tmissing\\n'; fi
`;

/** Start a setsid child that tries to outlive its command; the twin sees it run meanwhile. */
const SURVIVOR_PROBE = `
setsid bash -c 'exec -a "$${PROBE_ENV.marker}" sleep 300' </dev/null >/dev/null 2>&1 &
for i in 1 2 3 4 5 6 7 8 9 10; do
  if pgrep -f "^$${PROBE_ENV.marker}" >/dev/null; then printf 'survivor\\trunning\\n'; break; fi
  sleep 0.2
done
`;

/** Reach the host directly, and names through the egress proxy. */
const NETWORK_PROBE = `
printf 'interfaces\\t%s\\n' "$(ls /sys/class/net | tr '\\n' ' ')"
body() { tr '\\n\\t' '  ' </tmp/doctor-body 2>/dev/null | cut -c1-200; }
for t in $${PROBE_ENV.hostTargets}; do
  code=$(curl -sS -m 5 --noproxy '*' -o /tmp/doctor-body -w '%{http_code}' "http://$t/" 2>/tmp/doctor-err)
  printf 'host\\t%s\\t%s\\t%s %s\\n' "$t" "$code" "$(body)" "$(tr '\\n' ' ' </tmp/doctor-err | cut -c1-200)"
done
via() {
  name=$1; shift; rm -f /tmp/doctor-body
  [ -n "\${HTTP_PROXY:-}" ] || { printf 'egress\\t%s\\tnone\\tno egress proxy\\n' "$name"; return; }
  code=$(curl -sS -m 20 --noproxy '' --proxy "$HTTP_PROXY" -o /tmp/doctor-body -w '%{http_code}' "$@" 2>/tmp/doctor-err)
  printf 'egress\\t%s\\t%s\\t%s %s\\n' "$name" "$code" "$(body)" "$(tr '\\n' ' ' </tmp/doctor-err | cut -c1-200)"
}
p=$${PROBE_ENV.egressPort}
via denied "http://${DENIED_HOST}:$p/"
via twin "http://${TWIN_HOST}:$p/"
via internal-plain "http://localhost:$p/"
via internal-connect --proxytunnel "http://localhost:$p/"
via internal-literal "http://2130706433:$p/"
`;

/** Every probe that runs while the sandbox is up, in one command. */
export const PROBE_SCRIPT = [KEY_PROBE, ESCALATION_PROBE, NETWORK_PROBE, SURVIVOR_PROBE].join("\n");

/**
 * Mode kubernetes: connect (TCP) to `$DOCTOR_TARGET`, else to the API server's service address the
 * kubelet gives every pod (`KUBERNETES_SERVICE_HOST`/`_PORT`, read from pid 1 when the exec's own
 * environment lacks them). Prints `target` and `reach<TAB>exit<TAB>error` (exit 0: connected).
 */
export const POD_REACH_PROBE = `
svc() { tr '\\0' '\\n' </proc/1/environ 2>/dev/null | sed -n "s/^$1=//p"; }
t=\${${PROBE_ENV.target}:-}
if [ -z "$t" ]; then
  h=\${KUBERNETES_SERVICE_HOST:-$(svc KUBERNETES_SERVICE_HOST)}
  p=\${KUBERNETES_SERVICE_PORT:-$(svc KUBERNETES_SERVICE_PORT)}
  [ -n "$h" ] && [ -n "$p" ] && t="$h:$p"
fi
printf 'target\\t%s\\n' "$t"
[ -n "$t" ] || exit 0
out=$(timeout 5 bash -c 'exec 3<>"/dev/tcp/\${1%:*}/\${1##*:}"' _ "$t" 2>&1); rc=$?
printf 'reach\\t%s\\t%s\\n' "$rc" "$(printf %s "$out" | tr '\\n\\t' '  ' | cut -c1-200)"
`;

/** After the probe's command ended: is its setsid child still there? */
export const SURVIVOR_CHECK = `pgrep -af "^$${PROBE_ENV.marker}" || true`;

/** A write of `mib` MiB into the workspace, then a pause the disk watch needs to see it. */
export function fillScript(mib: number): string {
  return `f=/workspace/.doctor-fill
if dd if=/dev/zero of=$f bs=1M count=${mib} 2>/tmp/doctor-dd; then sleep 3; printf 'wrote\\n'
else printf 'write-failed\\t%s\\n' "$(tail -n 1 /tmp/doctor-dd)"; fi
printf 'size\\t%s\\n' "$(stat -c %s $f 2>/dev/null || echo 0)"
rm -f $f`;
}

/** The probe's lines as name → the fields of each line with that name. */
export function parseProbe(stdout: string): Map<string, string[][]> {
  const lines = new Map<string, string[][]>();
  for (const line of stdout.split("\n")) {
    const [name, ...fields] = line.split("\t");
    if (!name || fields.length === 0) continue;
    const list = lines.get(name) ?? [];
    list.push(fields);
    lines.set(name, list);
  }
  return lines;
}

/** What `ESCALATION_PROBE`'s lines say, for `judgeEscalation`. */
export function escalationSeen(probe: Map<string, string[][]>): EscalationObservation {
  const field = (name: string) => probe.get(name)?.[0] ?? [];
  const unshare = field("unshare");
  return {
    statusRead: probe.has("CapEff"),
    capEff: field("CapEff")[0] ?? "?",
    capPrm: field("CapPrm")[0] ?? "?",
    noNewPrivs: field("NoNewPrivs")[0] === "1",
    setuidFiles: (probe.get("setuid") ?? []).map((f) => f[0]),
    unshare: unshare[0] === "missing" ? "missing" : unshare[0] === "0" ? "succeeded" : "refused",
    unshareDetail: unshare[1] ?? unshare[0] ?? "",
  };
}
