/**
 * The egress proxy keeps plain-HTTP connections alive (HTTP/1.1) without loosening its checks:
 * every request on a kept-alive connection is judged by the policy and logged as the first one
 * is, and the upstream connection is reused only for the same host and port. A real upstream on
 * loopback (`network.hosts` maps the test's names to it); raw sockets on the client side, so that
 * what rides on one connection is exactly what the test wrote.
 */
import assert from "node:assert/strict";
import { AccessLog, type AccessLogEntry } from "../../lib/proxy/access_log.ts";
import { type EgressProxy, startEgressProxy } from "../../lib/proxy/egress_proxy.ts";

const encoder = new TextEncoder();
const decoder = new TextDecoder();
/** Every wait has a deadline, so that a regression fails naming what never came. */
const DEADLINE_MS = 10_000;

interface Seen {
  host: string | null;
  path: string;
  /** The upstream connection's source port, as the upstream sees it: one per connection. */
  fromPort: number;
}

/** An HTTP/1.1 server on 127.0.0.1 that records each request and the connection it came on. */
class Upstream implements AsyncDisposable {
  readonly seen: Seen[] = [];
  readonly #server = Deno.serve(
    { hostname: "127.0.0.1", port: 0, onListen: () => {} },
    (req, info) => {
      const url = new URL(req.url);
      this.seen.push({
        host: req.headers.get("host"),
        path: url.pathname,
        fromPort: (info.remoteAddr as Deno.NetAddr).port,
      });
      if (url.pathname === "/chunked") {
        return new Response(ReadableStream.from([encoder.encode("chun"), encoder.encode("ked")]));
      }
      return new Response(`hello ${url.pathname}`);
    },
  );

  get port(): number {
    return this.#server.addr.port;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.#server.shutdown();
  }
}

/** The proxy, allowing `web.test` and `other.test` on the upstream's port; `evil.test` is not. */
class Harness implements AsyncDisposable {
  readonly entries: AccessLogEntry[] = [];
  proxy!: EgressProxy;
  #waiting: { count: number; resolve: () => void } | undefined;

  static async start(upstream: Upstream): Promise<Harness> {
    const harness = new Harness();
    harness.proxy = await startEgressProxy({
      hostnames: ["127.0.0.1"],
      mode: "allowlist",
      allow: [`web.test:${upstream.port}`, `other.test:${upstream.port}`],
      hosts: { "web.test": "127.0.0.1", "other.test": "127.0.0.1", "evil.test": "127.0.0.1" },
      profile: "keepalive",
      log: new AccessLog({
        onEntry: (entry) => {
          harness.entries.push(entry);
          if (harness.#waiting && harness.entries.length >= harness.#waiting.count) {
            harness.#waiting.resolve();
          }
        },
      }),
      resolve: (name) => Promise.reject(new Error(`unexpected lookup of "${name}"`)),
    });
    return harness;
  }

  connect(): Promise<Deno.Conn> {
    return Deno.connect({
      hostname: "127.0.0.1",
      port: this.proxy.port,
      signal: AbortSignal.timeout(DEADLINE_MS),
    });
  }

  /** The log once it holds `count` entries (each is written when its request ends). */
  async logged(count: number): Promise<AccessLogEntry[]> {
    if (this.entries.length < count) {
      const { promise, resolve } = Promise.withResolvers<void>();
      this.#waiting = { count, resolve };
      const timer = setTimeout(resolve, DEADLINE_MS);
      await promise;
      clearTimeout(timer);
    }
    assert.ok(this.entries.length >= count, `expected ${count} log entries: ${this.dump()}`);
    return this.entries;
  }

  dump(): string {
    return JSON.stringify(this.entries.map((e) => [e.decision, e.host, e.path, e.status]));
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.proxy.close();
  }
}

/** A raw client connection that reads one response at a time. */
class Client implements Disposable {
  #pending = "";
  constructor(readonly conn: Deno.Conn) {}

  async send(text: string): Promise<void> {
    let bytes = encoder.encode(text);
    while (bytes.length > 0) bytes = bytes.subarray(await this.conn.write(bytes));
  }

  /** `GET http://HOST/PATH` as a kept-alive HTTP/1.1 request. */
  get(host: string, path: string): Promise<void> {
    return this.send(`GET http://${host}${path} HTTP/1.1\r\nHost: ${host}\r\n\r\n`);
  }

  /** One whole response (Content-Length or chunked), or null when the proxy closed first. */
  async response(): Promise<{ status: number; head: string; body: string } | null> {
    const timer = setTimeout(() => this.conn.close(), DEADLINE_MS);
    try {
      while (true) {
        const parsed = this.#parse();
        if (parsed) return parsed;
        const buffer = new Uint8Array(16 * 1024);
        const n = await this.conn.read(buffer);
        if (n === null) return null;
        this.#pending += decoder.decode(buffer.subarray(0, n), { stream: true });
      }
    } finally {
      clearTimeout(timer);
    }
  }

  /** True when the proxy closes the connection (reads end) before the deadline. */
  async closedByProxy(): Promise<boolean> {
    const timer = setTimeout(() => this.conn.close(), DEADLINE_MS);
    try {
      return await this.conn.read(new Uint8Array(1024)) === null;
    } catch {
      return false; // closed by our deadline
    } finally {
      clearTimeout(timer);
    }
  }

  #parse(): { status: number; head: string; body: string } | undefined {
    const end = this.#pending.indexOf("\r\n\r\n");
    if (end === -1) return undefined;
    const head = this.#pending.slice(0, end);
    const rest = this.#pending.slice(end + 4);
    const status = Number(/^HTTP\/1\.[01] (\d{3})/.exec(head)?.[1]);
    const length = /\r\ncontent-length: (\d+)/i.exec(head);
    let body: string | undefined;
    let used = 0;
    if (length) {
      if (rest.length >= Number(length[1])) [body, used] = [rest.slice(0, Number(length[1])), 0];
      used = Number(length[1]);
    } else if (/\r\ntransfer-encoding: chunked/i.test(head)) {
      const last = rest.indexOf("0\r\n\r\n");
      if (last !== -1) {
        used = last + 5;
        body = rest.slice(0, last).replace(/(^|\r\n)[0-9a-f]+\r\n/gi, "").replace(/\r\n$/, "");
      }
    } else body = rest;
    if (body === undefined) return undefined;
    this.#pending = rest.slice(used);
    return { status, head, body };
  }

  [Symbol.dispose](): void {
    try {
      this.conn.close();
    } catch {
      // Already closed, by the proxy or the deadline.
    }
  }
}

Deno.test("egress proxy: two requests on one kept-alive connection are both forwarded over one upstream connection, each logged", async () => {
  await using upstream = new Upstream();
  await using h = await Harness.start(upstream);
  using client = new Client(await h.connect());
  const web = `web.test:${upstream.port}`;
  await client.get(web, "/first");
  const first = await client.response();
  assert.equal(first?.status, 200, h.dump());
  assert.equal(first?.body, "hello /first");
  await client.get(web, "/chunked");
  const second = await client.response();
  assert.equal(second?.status, 200, h.dump());
  assert.equal(second?.body, "chunked");
  assert.deepEqual(upstream.seen.map((s) => [s.host, s.path]), [[web, "/first"], [
    web,
    "/chunked",
  ]]);
  assert.equal(
    upstream.seen[0].fromPort,
    upstream.seen[1].fromPort,
    "a second upstream connection",
  );
  const entries = await h.logged(2);
  assert.deepEqual(
    entries.map((e) => [e.decision, e.host, e.path, e.status, e.address]),
    [["allow", "web.test", "/first", 200, "127.0.0.1"], [
      "allow",
      "web.test",
      "/chunked",
      200,
      "127.0.0.1",
    ]],
  );
  assert.ok(entries.every((e) => e.bytesIn > 0 && e.bytesOut > 0), h.dump());
});

Deno.test("egress proxy: a second request on a kept-alive connection to a denied host is refused (403), logged, and reaches nothing", async (t) => {
  await using upstream = new Upstream();
  await using h = await Harness.start(upstream);
  const web = `web.test:${upstream.port}`;

  await t.step("twin: the same second request to an allowed host succeeds", async () => {
    using client = new Client(await h.connect());
    await client.get(web, "/one");
    assert.equal((await client.response())?.status, 200);
    await client.get(web, "/two");
    const second = await client.response();
    assert.equal(second?.status, 200, h.dump());
    assert.equal(second?.body, "hello /two");
  });

  await t.step("attack: to a host the policy denies, over the connection kept open", async () => {
    using client = new Client(await h.connect());
    await client.get(web, "/three");
    assert.equal((await client.response())?.status, 200);
    const before = upstream.seen.length;
    await client.get(`evil.test:${upstream.port}`, "/stolen");
    const refused = await client.response();
    assert.equal(refused?.status, 403, h.dump());
    assert.match(refused?.body ?? "", /"evil\.test:\d+" is not allowed/);
    assert.equal(upstream.seen.length, before, "the denied request reached the upstream");
    assert.ok(await client.closedByProxy(), "the connection stays open after a refusal");
    const entries = await h.logged(4);
    assert.deepEqual(
      [entries[3].decision, entries[3].host, entries[3].status],
      ["deny", "evil.test", 403],
      h.dump(),
    );
  });
});

Deno.test("egress proxy: a kept-alive request for another allowed host gets an upstream connection of its own", async () => {
  await using upstream = new Upstream();
  await using h = await Harness.start(upstream);
  using client = new Client(await h.connect());
  await client.get(`web.test:${upstream.port}`, "/a");
  assert.equal((await client.response())?.status, 200);
  await client.get(`other.test:${upstream.port}`, "/b");
  assert.equal((await client.response())?.status, 200, h.dump());
  assert.deepEqual(upstream.seen.map((s) => s.host), [
    `web.test:${upstream.port}`,
    `other.test:${upstream.port}`,
  ]);
  assert.notEqual(upstream.seen[0].fromPort, upstream.seen[1].fromPort);
  assert.deepEqual((await h.logged(2)).map((e) => e.host), ["web.test", "other.test"]);
});

Deno.test("egress proxy: a client that asks to close (or speaks HTTP/1.0) gets Connection: close and the connection ends", async () => {
  await using upstream = new Upstream();
  await using h = await Harness.start(upstream);
  for (
    const request of [
      `GET http://web.test:${upstream.port}/c HTTP/1.1\r\nConnection: close\r\n\r\n`,
      `GET http://web.test:${upstream.port}/d HTTP/1.0\r\n\r\n`,
    ]
  ) {
    using client = new Client(await h.connect());
    await client.send(request);
    const response = await client.response();
    assert.equal(response?.status, 200, request);
    assert.match(response?.head ?? "", /\r\nConnection: close(\r\n|$)/i);
    assert.ok(await client.closedByProxy(), request);
  }
});
