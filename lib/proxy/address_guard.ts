/**
 * Which addresses the egress proxy may connect to, and the one place a destination is resolved.
 *
 * The allowlist decides by name, but whoever controls a name's DNS decides what it resolves to:
 * an allowed name (or any label under an allowed wildcard, or `localhost`) can point at loopback,
 * the Docker bridges, the cloud metadata endpoint or the host's own address, and a proxy that
 * connects by name would carry the sandbox there. So a destination is resolved exactly once, here;
 * every answer is checked; only checked addresses are returned, and the proxy connects to those
 * literally (never by name, so a rebinding DNS server gets no second answer). Internal addresses
 * are refused unless the user mapped that very name to its address in `network.hosts`, which is
 * the only way to opt in. An IP literal target gets the same check (it was already canonicalised
 * the way a client parses it, so `2130706433`, `0x7f.1` and `127.1` arrive here as `127.0.0.1`).
 *
 * The idea follows anthropics/sandbox-runtime's `resolved-address-guard.ts` (resolve once, drop
 * denied addresses, dial a survivor, deny the host's own interface addresses, judge IPv6 forms by
 * the IPv4 address they carry). Unlike it, private ranges are denied by default here: the sandbox
 * runs on a developer machine whose LAN is exactly what it must not reach.
 */
import { isIpLiteral } from "./egress_policy.ts";

/** Resolve a host name to IP addresses (one lookup; the proxy never asks twice). */
export type Resolver = (hostname: string, signal: AbortSignal) => Promise<string[]>;

/** The system resolver (getaddrinfo: /etc/hosts, then DNS), as `Deno.connect` would use it. */
export async function systemResolver(hostname: string, signal: AbortSignal): Promise<string[]> {
  // Node's dns module loads on the first lookup: every session starts an egress proxy, and most
  // never resolve a name (loading it costs each start ~10 ms).
  const { lookup } = await import("node:dns/promises");
  // getaddrinfo cannot be cancelled; the caller stops waiting instead.
  const answer = lookup(hostname, { all: true, verbatim: true });
  const aborted = new Promise<never>((_, reject) => {
    const onAbort = () => reject(signal.reason);
    if (signal.aborted) onAbort();
    else signal.addEventListener("abort", onAbort, { once: true });
  });
  // Raced below; once the answer has won, a later abort has no one waiting for it: this keeps
  // that rejection from counting as unhandled (the race itself still sees an earlier one).
  aborted.catch(() => {});
  const records = await Promise.race([answer, aborted]);
  return records.map((record) => record.address);
}

/** Every address of every interface of this host (docker bridges included), read now. */
export function hostInterfaceAddresses(): string[] {
  return Deno.networkInterfaces().map((iface) => iface.address);
}

/** An address the proxy refused, and why (a class such as "a loopback address"). */
export interface RefusedAddress {
  address: string;
  why: string;
}

export type Destination =
  | {
    kind: "connect";
    /** Checked addresses, in the resolver's order; connect to these and nothing else. */
    addresses: string[];
    /** Where the addresses came from. */
    source: "hosts" | "literal" | "dns";
    /** Answers that were dropped because they are internal. */
    refused: RefusedAddress[];
  }
  | { kind: "internal"; source: "literal" | "dns"; refused: RefusedAddress[] };

export interface DestinationOptions {
  /** `network.hosts`: canonical name → canonical IP literal. Honoured as the user's explicit choice. */
  hosts: ReadonlyMap<string, string>;
  resolve: Resolver;
  /** This host's own addresses; read once per destination, since bridges come and go. */
  localAddresses: () => readonly string[];
  signal: AbortSignal;
}

/**
 * Decide where a connection to canonical `host` may go: the mapped address, or the checked
 * answers of one lookup. Lookup failures (no such name, a timeout) are raised as they come.
 */
export async function resolveDestination(
  host: string,
  options: DestinationOptions,
): Promise<Destination> {
  const mapped = options.hosts.get(host);
  if (mapped !== undefined) {
    return { kind: "connect", addresses: [unbracket(mapped)], source: "hosts", refused: [] };
  }
  const source = isIpLiteral(host) ? "literal" : "dns";
  const answers = source === "literal"
    ? [unbracket(host)]
    : [...new Set(await options.resolve(host, options.signal))];
  if (answers.length === 0) throw new Error(`no address for "${host}"`);
  const local = parseLocalAddresses(options.localAddresses());
  const addresses: string[] = [];
  const refused: RefusedAddress[] = [];
  for (const address of answers) {
    const why = internalAddressReason(address, local);
    if (why === undefined) addresses.push(address);
    else refused.push({ address, why });
  }
  return addresses.length > 0
    ? { kind: "connect", addresses, source, refused }
    : { kind: "internal", source, refused };
}

/** Parsed addresses of this host, for `internalAddressReason`. */
export type LocalAddresses = readonly Uint8Array[];

export function parseLocalAddresses(addresses: readonly string[]): LocalAddresses {
  return addresses.map(parseIpAddress).filter((bytes) => bytes !== undefined);
}

/**
 * Why the proxy must not connect to `address` (a class like "a loopback address"), or
 * `undefined` for an ordinary public address. Anything that does not parse is refused.
 */
export function internalAddressReason(
  address: string,
  local: LocalAddresses = [],
): string | undefined {
  const bytes = parseIpAddress(address);
  if (bytes === undefined) return "an address the proxy cannot parse";
  // The fixed classes first: "a loopback address" says more than "one of this host's own".
  const fixed = fixedClass(bytes, local);
  if (fixed !== undefined) return fixed;
  return isLocal(bytes, local) ? "one of this host's own addresses" : undefined;
}

function fixedClass(bytes: Uint8Array, local: LocalAddresses): string | undefined {
  if (bytes.length === 4) return ipv4Class(bytes);
  const special = firstMatch(IPV6_SPECIAL, bytes);
  if (special !== undefined) return special;
  for (const form of EMBEDDING_FORMS) {
    if (!inPrefix(bytes, form.prefix)) continue;
    const v4 = form.extract(bytes);
    const inner = ipv4Class(v4) ??
      (isLocal(v4, local) ? "one of this host's own addresses" : undefined);
    if (inner !== undefined) return `${inner} (${form.name})`;
    return form.publicAllowed ? undefined : `a reserved address (${form.name})`;
  }
  return firstMatch(IPV6_RANGES, bytes) ?? (inPrefix(bytes, GLOBAL_UNICAST) ? undefined : RESERVED);
}

/** 4 bytes for dotted-quad IPv4, 16 for IPv6 (brackets allowed, zones not); else undefined. */
export function parseIpAddress(text: string): Uint8Array | undefined {
  const bare = unbracket(text);
  return bare.includes(":") ? parseIpv6(bare) : parseIpv4(bare);
}

function parseIpv4(text: string): Uint8Array | undefined {
  const parts = text.split(".");
  if (parts.length !== 4) return undefined;
  const bytes = new Uint8Array(4);
  for (let i = 0; i < 4; i++) {
    // Strict dotted decimal only: resolvers and canonicalHost() produce nothing else, and a
    // leading zero could mean octal to someone else.
    if (!/^(0|[1-9]\d{0,2})$/.test(parts[i]) || Number(parts[i]) > 255) return undefined;
    bytes[i] = Number(parts[i]);
  }
  return bytes;
}

function parseIpv6(text: string): Uint8Array | undefined {
  if (!/^[0-9a-fA-F:.]+$/.test(text)) return undefined;
  const halves = text.split("::");
  if (halves.length > 2) return undefined;
  const groups = (half: string): number[] | undefined => {
    if (half === "") return [];
    const out: number[] = [];
    const pieces = half.split(":");
    for (let i = 0; i < pieces.length; i++) {
      const piece = pieces[i];
      if (i === pieces.length - 1 && piece.includes(".")) {
        const v4 = parseIpv4(piece);
        if (!v4) return undefined;
        out.push((v4[0] << 8) | v4[1], (v4[2] << 8) | v4[3]);
      } else if (/^[0-9a-fA-F]{1,4}$/.test(piece)) {
        out.push(parseInt(piece, 16));
      } else {
        return undefined;
      }
    }
    return out;
  };
  const head = groups(halves[0]);
  const tail = halves.length === 2 ? groups(halves[1]) : [];
  if (!head || !tail) return undefined;
  // A dotted quad may only end the address.
  if (halves.length === 2 && halves[0].includes(".")) return undefined;
  const missing = 8 - head.length - tail.length;
  if (halves.length === 1 ? missing !== 0 : missing < 1) return undefined;
  const all = [...head, ...new Array(halves.length === 2 ? missing : 0).fill(0), ...tail];
  const bytes = new Uint8Array(16);
  all.forEach((group, i) => {
    bytes[2 * i] = group >> 8;
    bytes[2 * i + 1] = group & 0xff;
  });
  return bytes;
}

function unbracket(text: string): string {
  return text.startsWith("[") && text.endsWith("]") ? text.slice(1, -1) : text;
}

interface Prefix {
  bytes: Uint8Array;
  bits: number;
}

function prefix(cidr: string): Prefix {
  const [address, bits] = cidr.split("/");
  const bytes = parseIpAddress(address);
  if (!bytes) throw new Error(`unreachable: bad range ${cidr}`);
  return { bytes, bits: bits === undefined ? bytes.length * 8 : Number(bits) };
}

function inPrefix(bytes: Uint8Array, range: Prefix): boolean {
  if (bytes.length !== range.bytes.length) return false;
  let bits = range.bits;
  for (let i = 0; bits > 0; i++, bits -= 8) {
    const mask = bits >= 8 ? 0xff : (0xff << (8 - bits)) & 0xff;
    if ((bytes[i] & mask) !== (range.bytes[i] & mask)) return false;
  }
  return true;
}

function isLocal(bytes: Uint8Array, local: LocalAddresses): boolean {
  return local.some((own) => own.length === bytes.length && own.every((b, i) => b === bytes[i]));
}

type RangeTable = readonly (readonly [Prefix, string])[];

function table(entries: readonly (readonly [string, string])[]): RangeTable {
  return entries.map(([cidr, why]) => [prefix(cidr), why] as const);
}

function firstMatch(ranges: RangeTable, bytes: Uint8Array): string | undefined {
  return ranges.find(([range]) => inPrefix(bytes, range))?.[1];
}

const RESERVED = "a reserved address";
const METADATA = "a cloud metadata address";

/** Most specific first, so that the reason names the narrowest class. */
const IPV4_RANGES = table([
  ["169.254.169.254", METADATA], // AWS, GCP, Azure, DigitalOcean, OpenStack…
  ["168.63.129.16", METADATA], // Azure WireServer
  ["100.100.100.200", METADATA], // Alibaba Cloud
  ["192.0.0.192", METADATA], // Oracle Cloud Classic
  ["255.255.255.255", "the broadcast address"],
  ["0.0.0.0/8", "an unspecified address"], // connects to this host on Linux
  ["10.0.0.0/8", "a private address"],
  ["100.64.0.0/10", "a shared (CGNAT) address"],
  ["127.0.0.0/8", "a loopback address"],
  ["169.254.0.0/16", "a link-local address"],
  ["172.16.0.0/12", "a private address"],
  ["192.0.0.0/24", RESERVED], // IETF protocol assignments
  ["192.0.2.0/24", RESERVED], // documentation
  ["192.88.99.0/24", RESERVED], // 6to4 relay anycast
  ["192.168.0.0/16", "a private address"],
  ["198.18.0.0/15", RESERVED], // benchmarking
  ["198.51.100.0/24", RESERVED], // documentation
  ["203.0.113.0/24", RESERVED], // documentation
  ["224.0.0.0/4", "a multicast address"],
  ["240.0.0.0/4", RESERVED],
]);

function ipv4Class(bytes: Uint8Array): string | undefined {
  return firstMatch(IPV4_RANGES, bytes);
}

/**
 * IPv6 forms that deliver to the IPv4 address they carry: judged by that address. Those whose
 * public IPv4 is an ordinary destination stay allowed; the others are refused whatever they carry.
 */
const EMBEDDING_FORMS: readonly {
  prefix: Prefix;
  name: string;
  publicAllowed: boolean;
  extract: (bytes: Uint8Array) => Uint8Array;
}[] = [
  {
    prefix: prefix("::ffff:0:0/96"),
    name: "IPv4-mapped IPv6",
    publicAllowed: true,
    extract: last32,
  },
  {
    prefix: prefix("::ffff:0:0:0/96"),
    name: "IPv4-translated IPv6",
    publicAllowed: false,
    extract: last32,
  },
  { prefix: prefix("::/96"), name: "IPv4-compatible IPv6", publicAllowed: false, extract: last32 },
  { prefix: prefix("64:ff9b::/96"), name: "NAT64", publicAllowed: true, extract: last32 },
  {
    prefix: prefix("64:ff9b:1::/48"),
    name: "local-use NAT64",
    publicAllowed: false,
    extract: last32,
  },
  { prefix: prefix("2002::/16"), name: "6to4", publicAllowed: true, extract: (b) => b.slice(2, 6) },
];

function last32(bytes: Uint8Array): Uint8Array {
  return bytes.slice(12, 16);
}

/** Checked before the embedding forms: `::/96` would otherwise read these as IPv4 0.0.0.x. */
const IPV6_SPECIAL = table([
  ["::", "an unspecified address"],
  ["::1", "a loopback address"],
]);

const IPV6_RANGES = table([
  ["fd00:ec2::/32", METADATA], // AWS IMDS (fd00:ec2::254) and its service block
  ["fd20:ce::254", METADATA], // Google Cloud, IPv6-only instances
  ["fc00::/7", "a unique-local address"],
  ["fe80::/10", "a link-local address"],
  ["fec0::/10", RESERVED], // site-local, deprecated
  ["ff00::/8", "a multicast address"],
  ["100::/64", RESERVED], // discard-only
  ["2001::/23", RESERVED], // IETF protocol assignments (Teredo, ORCHID…)
  ["2001:db8::/32", RESERVED], // documentation
  ["3fff::/20", RESERVED], // documentation
]);

/** Everything outside global unicast (2000::/3) is reserved or special. */
const GLOBAL_UNICAST = prefix("2000::/3");
