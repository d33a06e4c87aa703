/**
 * Which destinations a sandbox may reach through the egress proxy.
 *
 * Patterns (validated in lib/config.ts, re-checked here):
 * - `example.com`      exactly that host
 * - `*.example.com`    any subdomain at any depth (`a.example.com`, `a.b.example.com`), not the apex
 * - either with `:port`; without one, only ports 80 and 443 are allowed
 * - an IP literal (`10.0.0.5`, `[::1]:8080`) matches only itself; wildcards never match IPs
 *
 * Hosts are canonicalised before matching (lowercase, trailing dot dropped, numeric IPv4 forms
 * such as `2130706433` or `127.1` turned into dotted quads), and the proxy resolves the canonical
 * form, once, and connects only to an address it checked (lib/proxy/address_guard.ts), so what was
 * checked is what is reached. Anything that does not parse is denied.
 */

export type EgressMode = "none" | "allowlist" | "full";

export interface EgressDecision {
  allowed: boolean;
  /** The pattern that allowed it (as written), or "*" in mode "full". */
  rule?: string;
}

export type EgressPolicy = (host: string, port: number) => EgressDecision;

/** Ports allowed by a pattern that names none. */
export const DEFAULT_PORTS: readonly number[] = [80, 443];

interface CompiledRule {
  source: string;
  /** Canonical host, or the suffix after "*." for wildcards. */
  host: string;
  wildcard: boolean;
  /** `undefined`: the default ports. */
  port: number | undefined;
}

const DENY: EgressDecision = { allowed: false };

/** The policy for a network mode: "none" allows nothing, "full" every valid host and port. */
export function compileEgressPolicy(mode: EgressMode, allow: readonly string[]): EgressPolicy {
  switch (mode) {
    case "none":
      return () => DENY;
    case "full":
      return (host, port) =>
        canonicalHost(host) !== undefined && isValidPort(port)
          ? { allowed: true, rule: "*" }
          : DENY;
    case "allowlist":
      return compileAllowlist(allow);
  }
}

/** A matcher for allowlist patterns; raises `TypeError` on a pattern that does not parse. */
export function compileAllowlist(patterns: readonly string[]): EgressPolicy {
  const rules = patterns.map(parsePattern);
  return (host, port) => {
    const canonical = canonicalHost(host);
    if (canonical === undefined || !isValidPort(port)) return DENY;
    const hostIsIp = isIpLiteral(canonical);
    for (const rule of rules) {
      const portMatches = rule.port === undefined
        ? DEFAULT_PORTS.includes(port)
        : rule.port === port;
      if (!portMatches) continue;
      const hostMatches = rule.wildcard
        ? !hostIsIp && canonical.endsWith("." + rule.host)
        : canonical === rule.host;
      if (hostMatches) return { allowed: true, rule: rule.source };
    }
    return DENY;
  };
}

function parsePattern(pattern: string): CompiledRule {
  const invalid = () => new TypeError(`Invalid egress pattern "${pattern}"`);
  const { host: hostPart, port: portText } = splitHostPort(pattern.trim());
  let port: number | undefined;
  if (portText !== undefined) {
    port = Number(portText);
    if (!/^\d{1,5}$/.test(portText) || !isValidPort(port)) throw invalid();
  }
  const wildcard = hostPart.startsWith("*.");
  const host = canonicalHost(wildcard ? hostPart.slice(2) : hostPart);
  if (host === undefined || (wildcard && isIpLiteral(host))) throw invalid();
  return { source: pattern, host, wildcard, port };
}

/**
 * Split `host:port`, `[v6]:port`, `host` or a bare IPv6 literal. The port is returned as text,
 * unchecked; `undefined` when absent.
 */
export function splitHostPort(authority: string): { host: string; port: string | undefined } {
  if (authority.startsWith("[")) {
    const close = authority.indexOf("]");
    if (close === -1) return { host: authority, port: undefined };
    const rest = authority.slice(close + 1);
    return {
      host: authority.slice(0, close + 1),
      port: rest.startsWith(":") ? rest.slice(1) : rest === "" ? undefined : rest,
    };
  }
  const colon = authority.indexOf(":");
  // More than one colon without brackets: a bare IPv6 literal, which cannot carry a port.
  if (colon === -1 || authority.indexOf(":", colon + 1) !== -1) {
    return { host: authority, port: undefined };
  }
  return { host: authority.slice(0, colon), port: authority.slice(colon + 1) };
}

const HOSTNAME_CHARS = /^[a-z0-9._-]+$/i;
const IPV6_CHARS = /^[0-9a-f:.]+$/i;
const LABEL = /^[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?$/;
const IPV4 = /^\d{1,3}(\.\d{1,3}){3}$/;

/**
 * The canonical spelling of a host name or IP literal, or `undefined` when it is not one.
 * IPv6 literals come back in brackets, compressed (`[::1]`).
 */
export function canonicalHost(host: string): string | undefined {
  let text = host.endsWith(".") ? host.slice(0, -1) : host;
  const bracketed = text.startsWith("[") && text.endsWith("]");
  if (bracketed) text = text.slice(1, -1);
  const looksIpv6 = text.includes(":");
  // Strict character check before the URL parser, which would happily read "a.com@evil.com" or
  // "evil.com/x" as a host and hand back something else than what we were asked about.
  if (looksIpv6 ? !IPV6_CHARS.test(text) : bracketed || !HOSTNAME_CHARS.test(text)) {
    return undefined;
  }
  let canonical: string;
  try {
    canonical = new URL(`http://${looksIpv6 ? `[${text}]` : text}/`).hostname;
  } catch {
    return undefined;
  }
  if (canonical.startsWith("[") || IPV4.test(canonical)) return canonical;
  if (canonical.length > 253) return undefined;
  return canonical.split(".").every((label) => LABEL.test(label)) ? canonical : undefined;
}

/** True for a canonical IPv4 dotted quad or bracketed IPv6 literal. */
export function isIpLiteral(canonical: string): boolean {
  return canonical.startsWith("[") || IPV4.test(canonical);
}

/**
 * True for addresses that mean "every interface" ("0.0.0.0", "::", "", and their spellings).
 * The host proxies must never listen on those: the sandbox network must be the only way in.
 */
export function isUnspecifiedAddress(hostname: string): boolean {
  if (hostname.trim() === "") return true;
  const canonical = canonicalHost(hostname);
  return canonical === "0.0.0.0" || canonical === "[::]";
}

function isValidPort(port: number): boolean {
  return Number.isInteger(port) && port >= 1 && port <= 65_535;
}
