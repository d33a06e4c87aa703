/**
 * `sandbox egress suggest`: from the access log of some runs, the smallest allowlist that would
 * have let through what the egress proxy denied, for the user to review. Nothing is applied.
 *
 * Smallest means least permissive: one exact pattern per denied host (with its port unless it is
 * 80 or 443, which a pattern without a port allows), never a wildcard. Denials the allowlist
 * cannot lift are kept apart: a name that resolved to an internal address needs `network.hosts`,
 * and a profile in network mode `none` allows nothing whatever its list says.
 */
import type { AccessLogEntry } from "./access_log.ts";
import { DEFAULT_PORTS } from "./egress_policy.ts";
import { readLines } from "../lines.ts";

/** One pattern for `network.allow`, and how often it was denied. */
export interface SuggestedPattern {
  pattern: string;
  /** Denied requests or connections this pattern would have let through. */
  count: number;
  /** The runs they came from. */
  runs: string[];
}

/** The suggested patterns of one domain (its last two labels; an IP address stands alone). */
export interface SuggestedDomain {
  domain: string;
  count: number;
  patterns: SuggestedPattern[];
}

/** A denial an allowlist entry would not lift, with the proxy's reason. */
export interface UnliftedDenial {
  host: string;
  port: number;
  count: number;
  /** `internal_address`: map the name in `network.hosts`; `mode_none`: the network mode allows nothing. */
  why: "internal_address" | "mode_none";
  reason: string;
}

export interface EgressSuggestion {
  runs: string[];
  /** Egress denials read for those runs. */
  denied: number;
  domains: SuggestedDomain[];
  /** The patterns alone, in the order of `domains`: what `network.allow` would gain. */
  allow: string[];
  unlifted: UnliftedDenial[];
}

/** The pattern that allows exactly `host:port`. */
export function patternFor(host: string, port: number): string {
  const name = host.includes(":") && !host.startsWith("[") ? `[${host}]` : host;
  return DEFAULT_PORTS.includes(port) ? name : `${name}:${port}`;
}

/** The domain a host is grouped under: its last two labels, or itself for an IP address. */
export function domainOf(host: string): string {
  if (host.includes(":") || /^\d+(\.\d+){3}$/.test(host)) return host;
  return host.split(".").slice(-2).join(".");
}

function unliftedWhy(reason: string | undefined): UnliftedDenial["why"] | undefined {
  if (reason === undefined) return undefined;
  if (/internal address/.test(reason)) return "internal_address";
  if (/network mode "none"/.test(reason)) return "mode_none";
  return undefined;
}

/** The suggestion for the egress denials among `entries` of the runs `runIds`. */
export function suggestAllowlist(
  entries: Iterable<AccessLogEntry>,
  runIds: readonly string[],
): EgressSuggestion {
  const wanted = new Set(runIds);
  const patterns = new Map<string, SuggestedPattern>();
  const unlifted = new Map<string, UnliftedDenial>();
  let denied = 0;
  for (const entry of entries) {
    if (entry.kind !== "egress" || entry.decision !== "deny") continue;
    if (entry.runId === null || !wanted.has(entry.runId)) continue;
    // A request too malformed to name a host: nothing to allow.
    if (entry.host === "") continue;
    denied++;
    const host = entry.host.toLowerCase().replace(/\.$/, "");
    const why = unliftedWhy(entry.reason);
    if (why) {
      const key = `${why} ${host}:${entry.port}`;
      const found = unlifted.get(key);
      if (found) found.count++;
      else {
        unlifted.set(key, { host, port: entry.port, count: 1, why, reason: entry.reason ?? "" });
      }
      continue;
    }
    const pattern = patternFor(host, entry.port);
    const found = patterns.get(pattern) ?? { pattern, count: 0, runs: [] };
    found.count++;
    if (!found.runs.includes(entry.runId)) found.runs.push(entry.runId);
    patterns.set(pattern, found);
  }
  const domains = new Map<string, SuggestedDomain>();
  for (const suggested of patterns.values()) {
    const domain = domainOf(suggested.pattern.replace(/:\d+$/, "").replace(/^\[|\]$/g, ""));
    const group = domains.get(domain) ?? { domain, count: 0, patterns: [] };
    group.count += suggested.count;
    group.patterns.push(suggested);
    domains.set(domain, group);
  }
  const sorted = [...domains.values()].sort((a, b) =>
    b.count - a.count || a.domain.localeCompare(b.domain)
  );
  for (const group of sorted) {
    group.patterns.sort((a, b) => b.count - a.count || a.pattern.localeCompare(b.pattern));
  }
  return {
    runs: [...runIds],
    denied,
    domains: sorted,
    allow: sorted.flatMap((group) => group.patterns.map((p) => p.pattern)),
    unlifted: [...unlifted.values()].sort((a, b) => b.count - a.count),
  };
}

/**
 * The entries of the access log at `path` whose run is one of `runIds`, and which of those runs
 * have no entry at all. Lines that are not JSON objects (a torn last line) are skipped.
 */
export async function readRunAccess(
  path: string,
  runIds: readonly string[],
): Promise<{ entries: AccessLogEntry[]; missing: string[] }> {
  const wanted = new Set(runIds);
  const seen = new Set<string>();
  const entries: AccessLogEntry[] = [];
  let file: Deno.FsFile;
  try {
    file = await Deno.open(path, { read: true });
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return { entries, missing: [...runIds] };
    throw error;
  }
  for await (const line of readLines(file.readable)) {
    if (!line.trim()) continue;
    let entry: AccessLogEntry;
    try {
      entry = JSON.parse(line);
    } catch {
      // A line cut short by a writer that died mid-write: it names no decision to suggest from.
      continue;
    }
    if (typeof entry !== "object" || entry === null || typeof entry.runId !== "string") continue;
    if (!wanted.has(entry.runId)) continue;
    seen.add(entry.runId);
    entries.push(entry);
  }
  return { entries, missing: runIds.filter((id) => !seen.has(id)) };
}
