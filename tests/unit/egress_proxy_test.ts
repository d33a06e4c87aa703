import assert from "node:assert/strict";
import { AccessLog, type AccessLogEntry } from "../../lib/proxy/access_log.ts";
import {
  type EgressProxy,
  type EgressProxyOptions,
  startEgressProxy,
} from "../../lib/proxy/egress_proxy.ts";

/**
 * An ordinary public address, as a DNS server might answer for an allowed name. Never connected
 * to: tests that let the proxy "reach" it give it a `RecordingDialer`, which records the address
 * and connects to a server of the test's on loopback instead.
 */
const PUBLIC = "81.2.69.160";
/** PUBLIC as one decimal number, a spelling clients accept for an IPv4 address. */
const PUBLIC_DECIMAL = String(((81 * 256 + 2) * 256 + 69) * 256 + 160);

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/**
 * Every network wait in these tests has a deadline, so that a regression fails with the name of
 * what never came instead of hanging the run (a broken allowlist once made one test run for
 * minutes). Generous: the machine is shared, and a pass never waits for it.
 */
const DEADLINE_MS = 10_000;

/**
 * Run `work` (reads on `conn`) under the deadline. At the deadline the connection is closed,
 * which ends a pending read, and the test fails naming what it waited for.
 */
async function withDeadline<T>(
  conn: Deno.Conn,
  what: () => string,
  work: () => Promise<T>,
): Promise<T> {
  let timedOut = false;
  const timer = setTimeout(() => {
    timedOut = true;
    closeQuietly(conn);
  }, DEADLINE_MS);
  try {
    return await work();
  } catch (error) {
    if (timedOut) {
      throw new Error(`Timed out after ${DEADLINE_MS} ms waiting for ${what()}`, { cause: error });
    }
    throw error;
  } finally {
    clearTimeout(timer);
  }
}

function closeQuietly(conn: Deno.Conn): void {
  try {
    conn.close();
  } catch {
    // Already closed (by the deadline, or by the test).
  }
}

/** A TCP connection to 127.0.0.1:`port`, or a failure naming `what` at the deadline. */
async function connectTo(port: number, what: string): Promise<Deno.Conn> {
  try {
    return await Deno.connect({
      hostname: "127.0.0.1",
      port,
      signal: AbortSignal.timeout(DEADLINE_MS),
    });
  } catch (error) {
    if (error instanceof DOMException && error.name === "TimeoutError") {
      throw new Error(`Timed out after ${DEADLINE_MS} ms connecting to ${what}`, { cause: error });
    }
    throw error;
  }
}

/** A TCP server on 127.0.0.1 that echoes every byte back and closes when the client does. */
class EchoServer implements AsyncDisposable {
  readonly #listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  readonly #conns = new Set<Deno.Conn>();
  readonly #handlers = new Set<Promise<void>>();
  readonly #accepting: Promise<void>;
  /** How many connections were accepted. */
  accepted = 0;

  constructor() {
    this.#accepting = (async () => {
      try {
        for await (const conn of this.#listener) {
          this.accepted++;
          this.#conns.add(conn);
          const handler = this.#echo(conn);
          this.#handlers.add(handler);
        }
      } catch {
        // The listener was closed.
      }
    })();
  }

  get port(): number {
    return this.#listener.addr.port;
  }

  async #echo(conn: Deno.Conn): Promise<void> {
    const buffer = new Uint8Array(16 * 1024);
    try {
      while (true) {
        const n = await conn.read(buffer);
        if (n === null) break;
        await conn.write(buffer.subarray(0, n));
      }
    } catch {
      // Reset by the proxy.
    } finally {
      this.#conns.delete(conn);
      try {
        conn.close();
      } catch {
        // Already closed by dispose.
      }
    }
  }

  async [Symbol.asyncDispose](): Promise<void> {
    this.#listener.close();
    await this.#accepting;
    for (const conn of this.#conns) conn.close();
    await Promise.allSettled([...this.#handlers]);
  }
}

interface SeenRequest {
  method: string;
  path: string;
  headers: Headers;
  body: string;
}

/** A plain HTTP server on 127.0.0.1 that records requests and answers "hello from web". */
class WebServer implements AsyncDisposable {
  readonly requests: SeenRequest[] = [];
  readonly #server = Deno.serve(
    { hostname: "127.0.0.1", port: 0, onListen: () => {} },
    async (req) => {
      const url = new URL(req.url);
      this.requests.push({
        method: req.method,
        path: url.pathname + url.search,
        headers: req.headers,
        body: await req.text(),
      });
      return new Response("hello from web", { headers: { "x-web": "1" } });
    },
  );

  get port(): number {
    return this.#server.addr.port;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.#server.shutdown();
  }
}

/** A resolver the test scripts: answer `n` (1-based) for the n-th lookup; counts lookups. */
class ScriptedResolver {
  readonly lookups: string[] = [];
  constructor(readonly answer: (hostname: string, n: number) => string[]) {}

  resolve = (hostname: string): Promise<string[]> => {
    this.lookups.push(hostname);
    return Promise.resolve(this.answer(hostname, this.lookups.length));
  };
}

/**
 * Records which address and port the proxy dials, and connects to `localPort` on loopback
 * instead, so that no test ever reaches a public address. Without a port every dial is refused,
 * so that a proxy that should not have dialled answers 502 at once instead of holding a tunnel.
 */
class RecordingDialer {
  readonly dialled: string[] = [];
  constructor(readonly localPort?: number) {}

  dial = (address: string, port: number, signal: AbortSignal): Promise<Deno.Conn> => {
    this.dialled.push(`${address} ${port}`);
    if (this.localPort === undefined) {
      return Promise.reject(new Deno.errors.ConnectionRefused("the test refuses every dial"));
    }
    return Deno.connect({ hostname: "127.0.0.1", port: this.localPort, signal });
  };
}

/** An egress proxy on 127.0.0.1 whose log entries the test can wait for. */
class ProxyHarness implements AsyncDisposable {
  readonly entries: AccessLogEntry[] = [];
  readonly #waiters: { count: number; resolve: () => void }[] = [];
  readonly log = new AccessLog({
    onEntry: (entry) => {
      this.entries.push(entry);
      for (const waiter of this.#waiters.filter((w) => this.entries.length >= w.count)) {
        waiter.resolve();
      }
    },
  });
  proxy!: EgressProxy;

  static async start(options: Partial<EgressProxyOptions>): Promise<ProxyHarness> {
    const harness = new ProxyHarness();
    harness.proxy = await startEgressProxy({
      hostnames: ["127.0.0.1"],
      mode: "allowlist",
      allow: [],
      profile: "work",
      runId: "run-1",
      log: harness.log,
      // No DNS in unit tests: a test that needs a lookup gives its own resolver.
      resolve: (hostname) => Promise.reject(new Error(`unexpected lookup of "${hostname}"`)),
      ...options,
    });
    return harness;
  }

  /** A raw TCP connection to the proxy. */
  connect(): Promise<Deno.Conn> {
    return connectTo(this.proxy.port, "the egress proxy");
  }

  /** Resolves once `count` entries were logged in total (entries are written when connections end). */
  async entriesLogged(count: number): Promise<AccessLogEntry[]> {
    if (this.entries.length >= count) return this.entries;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const logged = new Promise<void>((resolve) => this.#waiters.push({ count, resolve }));
    const late = new Promise<never>((_, reject) => {
      timer = setTimeout(
        () =>
          reject(
            new Error(
              `Timed out after ${DEADLINE_MS} ms waiting for ${count} access log entries; got ${this.entries.length}: ${
                JSON.stringify(this.entries)
              }`,
            ),
          ),
        DEADLINE_MS,
      );
    });
    try {
      await Promise.race([logged, late]);
    } finally {
      clearTimeout(timer);
    }
    return this.entries;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.proxy.close();
    await this.log.close();
  }
}

async function writeText(conn: Deno.Conn, text: string): Promise<void> {
  let bytes = encoder.encode(text);
  while (bytes.length > 0) bytes = bytes.subarray(await conn.write(bytes));
}

/** Read until the text received so far contains `marker`; returns all of it. */
function readUntil(conn: Deno.Conn, marker: string): Promise<string> {
  let text = "";
  return withDeadline(
    conn,
    () => `${JSON.stringify(marker)} from the proxy; got ${JSON.stringify(text)}`,
    async () => {
      const buffer = new Uint8Array(16 * 1024);
      while (!text.includes(marker)) {
        const n = await conn.read(buffer);
        if (n === null) {
          throw new Error(
            `connection ended before ${JSON.stringify(marker)}; got ${JSON.stringify(text)}`,
          );
        }
        text += decoder.decode(buffer.subarray(0, n), { stream: true });
      }
      return text;
    },
  );
}

/** Read until the other side closes. */
function readToEnd(conn: Deno.Conn): Promise<string> {
  let text = "";
  return withDeadline(
    conn,
    () => `the proxy to close the connection; got ${JSON.stringify(text)}`,
    async () => {
      const buffer = new Uint8Array(16 * 1024);
      while (true) {
        const n = await conn.read(buffer);
        if (n === null) return text;
        text += decoder.decode(buffer.subarray(0, n), { stream: true });
      }
    },
  );
}

/**
 * Send `request` on a new connection and return everything the proxy answers. The request is
 * followed by a half-close, so that a tunnel opened by mistake ends at once (the echo server
 * closes on EOF) and the test fails on the status instead of waiting for its deadline.
 */
async function exchange(harness: ProxyHarness, request: string): Promise<string> {
  const conn = await harness.connect();
  try {
    await writeText(conn, request);
    await conn.closeWrite();
    return await readToEnd(conn);
  } finally {
    closeQuietly(conn);
  }
}

function connectRequest(authority: string): string {
  return `CONNECT ${authority} HTTP/1.1\r\nHost: ${authority}\r\n\r\n`;
}

function statusOf(response: string): number {
  return Number(/^HTTP\/1\.1 (\d{3})/.exec(response)?.[1]);
}

function bodyOf(response: string): string {
  return response.slice(response.indexOf("\r\n\r\n") + 4);
}

/** A port on 127.0.0.1 that nothing listens on. */
function closedPort(): number {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = listener.addr.port;
  listener.close();
  return port;
}

const ESTABLISHED = "HTTP/1.1 200 Connection Established\r\n\r\n";

Deno.test("startEgressProxy() tunnels an allowed CONNECT both ways and logs the bytes", async () => {
  await using echo = new EchoServer();
  await using h = await ProxyHarness.start({
    allow: [`echo.test:${echo.port}`],
    hosts: { "echo.test": "127.0.0.1" },
  });
  const request = connectRequest(`echo.test:${echo.port}`);
  const conn = await h.connect();
  try {
    await writeText(conn, request);
    assert.equal(await readUntil(conn, "\r\n\r\n"), ESTABLISHED);
    await writeText(conn, "ping\n");
    assert.equal(await readUntil(conn, "ping\n"), "ping\n");
    await writeText(conn, "second\n");
    assert.equal(await readUntil(conn, "second\n"), "second\n");
    // A half-close is passed on: the echo server sees EOF, closes, and so does the tunnel.
    await conn.closeWrite();
    assert.equal(await readToEnd(conn), "");
  } finally {
    closeQuietly(conn);
  }

  const [entry] = await h.entriesLogged(1);
  assert.deepEqual({ ...entry, time: undefined, durationMs: undefined }, {
    time: undefined,
    kind: "egress",
    decision: "allow",
    method: "CONNECT",
    host: "echo.test",
    port: echo.port,
    address: "127.0.0.1",
    path: undefined,
    status: 200,
    bytesIn: ESTABLISHED.length + "ping\nsecond\n".length,
    bytesOut: request.length + "ping\nsecond\n".length,
    durationMs: undefined,
    profile: "work",
    runId: "run-1",
  });
  assert.equal(new Date(entry.time).toISOString(), entry.time);
});

Deno.test("startEgressProxy() forwards bytes sent right behind the CONNECT head", async () => {
  await using echo = new EchoServer();
  await using h = await ProxyHarness.start({
    allow: [`echo.test:${echo.port}`],
    hosts: { "echo.test": "127.0.0.1" },
  });
  const conn = await h.connect();
  try {
    // Like a TLS client that sends its ClientHello without waiting for the 200.
    await writeText(conn, connectRequest(`echo.test:${echo.port}`) + "early bytes");
    assert.equal(await readUntil(conn, "early bytes"), ESTABLISHED + "early bytes");
  } finally {
    closeQuietly(conn);
  }
});

Deno.test("startEgressProxy() answers a denied CONNECT with 403 and a reason the agent can read", async () => {
  await using echo = new EchoServer();
  await using h = await ProxyHarness.start({
    allow: ["a.com", "*.b.org"],
    hosts: { "evil.test": "127.0.0.1" },
  });
  const response = await exchange(h, connectRequest("evil.test:443"));
  assert.equal(statusOf(response), 403);
  assert.match(response, /\r\nContent-Type: text\/plain; charset=utf-8\r\n/);
  assert.equal(
    bodyOf(response),
    'sandbox egress proxy: "evil.test:443" is not allowed by the allowlist policy of profile "work" (allowed: a.com, *.b.org)\n',
  );
  assert.equal(echo.accepted, 0);

  const [entry] = await h.entriesLogged(1);
  assert.equal(entry.decision, "deny");
  assert.equal(entry.status, 403);
  assert.equal(entry.host, "evil.test");
  assert.equal(entry.port, 443);
  assert.match(entry.reason ?? "", /not allowed/);
});

Deno.test("startEgressProxy() applies wildcard and port rules", async (t) => {
  await using echo = new EchoServer();
  const hosts = { "echo.test": "127.0.0.1", "a.b.echo.test": "127.0.0.1" };

  await t.step("a pattern without a port does not allow other ports", async () => {
    await using h = await ProxyHarness.start({ allow: ["echo.test", "*.echo.test"], hosts });
    assert.equal(statusOf(await exchange(h, connectRequest(`echo.test:${echo.port}`))), 403);
    assert.equal(statusOf(await exchange(h, connectRequest(`a.b.echo.test:${echo.port}`))), 403);
  });

  await t.step("a wildcard with a port allows subdomains on that port, not the apex", async () => {
    await using h = await ProxyHarness.start({ allow: [`*.echo.test:${echo.port}`], hosts });
    const conn = await h.connect();
    try {
      await writeText(conn, connectRequest(`A.B.Echo.Test.:${echo.port}`));
      assert.equal(await readUntil(conn, "\r\n\r\n"), ESTABLISHED);
    } finally {
      closeQuietly(conn);
    }
    assert.equal(statusOf(await exchange(h, connectRequest(`echo.test:${echo.port}`))), 403);
  });

  await t.step("an IP literal is allowed only when listed, in any spelling", async () => {
    const dialer = new RecordingDialer(echo.port);
    await using h = await ProxyHarness.start({ allow: [`${PUBLIC}:8080`], dial: dialer.dial });
    for (const host of [PUBLIC, PUBLIC_DECIMAL]) {
      const conn = await h.connect();
      try {
        await writeText(conn, connectRequest(`${host}:8080`));
        assert.equal(await readUntil(conn, "\r\n\r\n"), ESTABLISHED, host);
      } finally {
        closeQuietly(conn);
      }
    }
    const denied = await exchange(h, connectRequest(`${PUBLIC}:8081`));
    assert.equal(statusOf(denied), 403);
    assert.match(bodyOf(denied), /is not allowed by the allowlist policy/);
    assert.deepEqual(dialer.dialled, [`${PUBLIC} 8080`, `${PUBLIC} 8080`]);
  });
});

Deno.test("startEgressProxy() in mode none denies everything, listed or not", async () => {
  await using echo = new EchoServer();
  await using h = await ProxyHarness.start({
    mode: "none",
    allow: [`echo.test:${echo.port}`],
    hosts: { "echo.test": "127.0.0.1" },
  });
  const response = await exchange(h, connectRequest(`echo.test:${echo.port}`));
  assert.equal(statusOf(response), 403);
  assert.match(bodyOf(response), /network mode "none" of profile "work" allows no egress/);
  assert.equal(statusOf(await exchange(h, "GET http://echo.test/ HTTP/1.1\r\n\r\n")), 403);
  assert.equal(echo.accepted, 0);
});

Deno.test("startEgressProxy() in mode full allows any host", async () => {
  await using echo = new EchoServer();
  await using h = await ProxyHarness.start({
    mode: "full",
    hosts: { "anything.test": "127.0.0.1" },
  });
  const conn = await h.connect();
  try {
    await writeText(conn, connectRequest(`anything.test:${echo.port}`) + "hi");
    assert.equal(await readUntil(conn, "hi"), ESTABLISHED + "hi");
  } finally {
    closeQuietly(conn);
  }
});

Deno.test("startEgressProxy() forwards plain HTTP in origin form after the policy check", async (t) => {
  await using web = new WebServer();
  await using h = await ProxyHarness.start({
    allow: [`web.test:${web.port}`],
    hosts: { "web.test": "127.0.0.1", "evil.test": "127.0.0.1" },
  });

  await t.step(
    "a GET is forwarded with Host from the URL and without proxy or hop headers",
    async () => {
      const response = await exchange(
        h,
        [
          `GET http://web.test:${web.port}/path/file?q=1 HTTP/1.1`,
          "Host: evil.test",
          "Proxy-Authorization: Basic c2VjcmV0",
          "Proxy-Connection: keep-alive",
          "Connection: keep-alive, X-Hop",
          "X-Hop: dropped",
          "X-Keep: kept",
          "",
          "",
        ].join("\r\n"),
      );
      assert.equal(statusOf(response), 200, response);
      assert.match(response, /\r\nx-web: 1\r\n/);
      assert.equal(bodyOf(response), "hello from web");
      const seen = web.requests.at(-1)!;
      assert.equal(seen.path, "/path/file?q=1");
      assert.equal(seen.headers.get("host"), `web.test:${web.port}`);
      assert.equal(seen.headers.get("x-keep"), "kept");
      for (const name of ["proxy-authorization", "proxy-connection", "x-hop"]) {
        assert.equal(seen.headers.get(name), null, name);
      }
    },
  );

  await t.step("a body framed by Content-Length is forwarded, and nothing after it", async () => {
    const before = web.requests.length;
    const smuggled =
      `GET http://evil.test:${web.port}/smuggled HTTP/1.1\r\nHost: evil.test\r\n\r\n`;
    const response = await exchange(
      h,
      `POST http://web.test:${web.port}/upload HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello` +
        smuggled,
    );
    assert.equal(statusOf(response), 200, response);
    assert.equal(web.requests.length, before + 1);
    assert.deepEqual([web.requests.at(-1)!.method, web.requests.at(-1)!.body], ["POST", "hello"]);
  });

  await t.step("a chunked body is forwarded to its last chunk", async () => {
    const response = await exchange(
      h,
      `POST http://web.test:${web.port}/upload HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n` +
        "5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\n",
    );
    assert.equal(statusOf(response), 200, response);
    assert.equal(web.requests.at(-1)!.body, "hello world");
  });

  await t.step("a host that is not allowed gets 403 and reaches nothing", async () => {
    const before = web.requests.length;
    const response = await exchange(
      h,
      `GET http://evil.test:${web.port}/ HTTP/1.1\r\nHost: web.test\r\n\r\n`,
    );
    assert.equal(statusOf(response), 403);
    assert.match(bodyOf(response), new RegExp(`"evil.test:${web.port}" is not allowed`));
    assert.equal(web.requests.length, before);
  });

  const entries = await h.entriesLogged(4);
  const [get] = entries;
  assert.equal(get.method, "GET");
  assert.equal(get.decision, "allow");
  assert.equal(get.status, 200);
  // The query string is left out of the log.
  assert.equal(get.path, "/path/file");
  assert.ok(get.bytesIn > 0 && get.bytesOut > 0);
  assert.equal(entries[3].decision, "deny");
});

Deno.test("startEgressProxy() answers malformed requests with 400", async (t) => {
  await using h = await ProxyHarness.start({ mode: "full" });
  const cases: [string, string][] = [
    ["not HTTP", "hello there\r\n\r\n"],
    ["an origin-form request", "GET / HTTP/1.1\r\nHost: a.com\r\n\r\n"],
    ["an https:// URL without CONNECT", "GET https://a.com/ HTTP/1.1\r\n\r\n"],
    ["CONNECT without a port", "CONNECT a.com HTTP/1.1\r\n\r\n"],
    ["CONNECT to a name with a slash", "CONNECT a.com/x:443 HTTP/1.1\r\n\r\n"],
    ["a folded header", "GET http://a.com/ HTTP/1.1\r\nX-A: 1\r\n  continued\r\n\r\n"],
    [
      "both Content-Length and Transfer-Encoding",
      "POST http://a.com/ HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
    ],
    [
      "conflicting Content-Length values",
      "POST http://a.com/ HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
    ],
  ];
  for (const [name, request] of cases) {
    await t.step(name, async () => {
      const response = await exchange(h, request);
      assert.equal(statusOf(response), 400, response);
      assert.match(bodyOf(response), /^sandbox egress proxy: malformed request/);
    });
  }
  const entries = await h.entriesLogged(cases.length);
  assert.ok(entries.every((entry) => entry.decision === "deny" && entry.status === 400));
});

Deno.test("startEgressProxy() answers 431 to a request head over 64 KiB", async () => {
  await using h = await ProxyHarness.start({ mode: "full" });
  const response = await exchange(
    h,
    `GET http://a.com/ HTTP/1.1\r\nX-Big: ${"a".repeat(70 * 1024)}\r\n\r\n`,
  );
  assert.equal(statusOf(response), 431);
});

Deno.test("startEgressProxy() answers 502 when the upstream refuses the connection", async () => {
  await using h = await ProxyHarness.start({ mode: "full", hosts: { "down.test": "127.0.0.1" } });
  const port = closedPort();
  const response = await exchange(h, connectRequest(`down.test:${port}`));
  assert.equal(statusOf(response), 502);
  assert.match(bodyOf(response), new RegExp(`cannot connect to "down.test:${port}"`));
  const [entry] = await h.entriesLogged(1);
  assert.deepEqual([entry.decision, entry.status], ["allow", 502]);
});

Deno.test("startEgressProxy() logs nothing for a connection that sent nothing", async () => {
  await using h = await ProxyHarness.start({ mode: "full" });
  const conn = await h.connect();
  conn.close();
  // A second, real request: its entry is the first one logged.
  await exchange(h, "hello\r\n\r\n");
  const entries = await h.entriesLogged(1);
  assert.equal(entries[0].status, 400);
  await h.proxy.close();
  assert.equal(h.entries.length, 1);
});

Deno.test("startEgressProxy() close() ends live tunnels", async () => {
  await using echo = new EchoServer();
  const h = await ProxyHarness.start({
    allow: [`echo.test:${echo.port}`],
    hosts: { "echo.test": "127.0.0.1" },
  });
  const conn = await h.connect();
  try {
    await writeText(conn, connectRequest(`echo.test:${echo.port}`) + "x");
    await readUntil(conn, ESTABLISHED + "x");
    await h.proxy.close();
    // The tunnel ends: an orderly close, or a reset; never a hang or anything else.
    const ended = await readToEnd(conn).then((text) => ({ text }), (error) => ({ error }));
    if ("error" in ended) {
      assert.ok(ended.error instanceof Deno.errors.ConnectionReset, String(ended.error));
    } else {
      assert.equal(ended.text, "");
    }
  } finally {
    closeQuietly(conn);
    await h[Symbol.asyncDispose]();
  }
});

Deno.test("startEgressProxy() stops when its signal aborts", async () => {
  const controller = new AbortController();
  const proxy = await startEgressProxy({
    hostnames: ["127.0.0.1"],
    mode: "none",
    allow: [],
    profile: "p",
    signal: controller.signal,
  });
  controller.abort();
  await proxy.close();
  await assert.rejects(connectTo(proxy.port, "the closed proxy"), Deno.errors.ConnectionRefused);
});

Deno.test("startEgressProxy() refuses to listen on all interfaces", async () => {
  for (const hostname of ["0.0.0.0", "::", "[::]", "0", ""]) {
    await assert.rejects(
      startEgressProxy({
        hostnames: ["127.0.0.1", hostname],
        mode: "none",
        allow: [],
        profile: "p",
      }),
      TypeError,
      hostname,
    );
  }
  await assert.rejects(
    startEgressProxy({ hostnames: [], mode: "none", allow: [], profile: "p" }),
    TypeError,
  );
});

Deno.test("startEgressProxy() closes what it opened when a later address fails", async () => {
  await assert.rejects(
    startEgressProxy({
      hostnames: ["127.0.0.1", "127.0.0.1"],
      mode: "none",
      allow: [],
      profile: "p",
    }),
    Deno.errors.AddrInUse,
  );
});

Deno.test("startEgressProxy() reports its address as a proxy URL", async () => {
  await using h = await ProxyHarness.start({ mode: "none" });
  assert.deepEqual(h.proxy.addresses, [{ hostname: "127.0.0.1", port: h.proxy.port }]);
  assert.equal(h.proxy.url("127.0.0.1"), `http://127.0.0.1:${h.proxy.port}`);
  assert.equal(h.proxy.url("::1"), `http://[::1]:${h.proxy.port}`);
});

// --- Internal addresses behind allowed names (issue 9, item 6) ---

/** What the proxy answers when an allowed name resolved only to internal addresses. */
function internalNameBody(authority: string, classes: string): string {
  return `sandbox egress proxy: "${authority}" resolved to an internal address (${classes}), ` +
    `which the egress proxy does not connect to by name; to allow it, map the name to that ` +
    `address in network.hosts of profile "work" (the access log has the address)\n`;
}

/** What the proxy answers to an IP literal target in an internal range. */
function internalLiteralBody(authority: string, classes: string): string {
  return `sandbox egress proxy: "${authority}" is an internal address (${classes}), which the ` +
    `egress proxy does not connect to; to reach it, map a name to it in network.hosts of ` +
    `profile "work" and allow that name\n`;
}

Deno.test("startEgressProxy() refuses an allowed name that resolves to loopback, and connects when network.hosts maps it", async (t) => {
  await using echo = new EchoServer();
  await using web = new WebServer();
  const resolver = new ScriptedResolver(() => ["127.0.0.1"]);
  const allow = [`app.test:${echo.port}`, `app.test:${web.port}`];

  await t.step("CONNECT: 403 naming the rule and network.hosts; nothing reached", async () => {
    await using h = await ProxyHarness.start({ allow, resolve: resolver.resolve });
    const response = await exchange(h, connectRequest(`app.test:${echo.port}`));
    assert.equal(statusOf(response), 403, response);
    assert.equal(bodyOf(response), internalNameBody(`app.test:${echo.port}`, "a loopback address"));
    assert.equal(echo.accepted, 0);
    const [entry] = await h.entriesLogged(1);
    assert.deepEqual([entry.decision, entry.status, entry.address], ["deny", 403, undefined]);
    // The log, unlike the sandbox, is told the address, so that the user can map it.
    assert.match(entry.reason ?? "", /; resolved: 127\.0\.0\.1 \(a loopback address\)$/);
  });

  await t.step("plain HTTP: the same refusal from the same decision", async () => {
    await using h = await ProxyHarness.start({ allow, resolve: resolver.resolve });
    const response = await exchange(h, `GET http://app.test:${web.port}/ HTTP/1.1\r\n\r\n`);
    assert.equal(statusOf(response), 403, response);
    assert.equal(bodyOf(response), internalNameBody(`app.test:${web.port}`, "a loopback address"));
    assert.equal(web.requests.length, 0);
  });

  await t.step("the same requests with the name mapped in network.hosts are allowed", async () => {
    const lookupsBefore = resolver.lookups.length;
    await using h = await ProxyHarness.start({
      allow,
      resolve: resolver.resolve,
      hosts: { "App.Test": "127.0.0.1" },
    });
    const conn = await h.connect();
    try {
      await writeText(conn, connectRequest(`app.test:${echo.port}`) + "ping");
      assert.equal(await readUntil(conn, "ping"), ESTABLISHED + "ping");
    } finally {
      closeQuietly(conn);
    }
    const response = await exchange(h, `GET http://app.test:${web.port}/ HTTP/1.1\r\n\r\n`);
    assert.equal(statusOf(response), 200, response);
    assert.equal(bodyOf(response), "hello from web");
    // A mapped name is not looked up at all.
    assert.equal(resolver.lookups.length, lookupsBefore);
    const entries = await h.entriesLogged(2);
    assert.deepEqual(
      entries.map((e) => [e.decision, e.status, e.address]),
      [["allow", 200, "127.0.0.1"], ["allow", 200, "127.0.0.1"]],
    );
  });
});

Deno.test("startEgressProxy() refuses every internal class an allowed name can resolve to", async (t) => {
  await using echo = new EchoServer();
  const OWN = "81.2.69.161"; // stands for a public address of this host's own interfaces
  const cases: [answer: string, classes: string][] = [
    ["127.0.0.53", "a loopback address"],
    ["::1", "a loopback address"],
    ["10.1.2.3", "a private address"],
    ["172.17.0.1", "a private address"],
    ["192.168.1.1", "a private address"],
    ["100.64.0.1", "a shared (CGNAT) address"],
    ["169.254.1.1", "a link-local address"],
    ["fe80::1", "a link-local address"],
    ["169.254.169.254", "a cloud metadata address"],
    ["fd00:ec2::254", "a cloud metadata address"],
    ["fc00::1", "a unique-local address"],
    ["fd12:3456::1", "a unique-local address"],
    ["0.0.0.0", "an unspecified address"],
    ["::", "an unspecified address"],
    ["224.0.0.1", "a multicast address"],
    ["ff02::1", "a multicast address"],
    ["255.255.255.255", "the broadcast address"],
    ["240.0.0.1", "a reserved address"],
    ["192.0.2.1", "a reserved address"],
    ["::ffff:127.0.0.1", "a loopback address (IPv4-mapped IPv6)"],
    ["::ffff:a9fe:a9fe", "a cloud metadata address (IPv4-mapped IPv6)"],
    ["64:ff9b::7f00:1", "a loopback address (NAT64)"],
    ["64:ff9b::a00:1", "a private address (NAT64)"],
    ["2002:7f00:1::1", "a loopback address (6to4)"],
    [OWN, "one of this host's own addresses"],
    [`::ffff:${OWN}`, "one of this host's own addresses (IPv4-mapped IPv6)"],
    ["not-an-address", "an address the proxy cannot parse"],
  ];
  const dialer = new RecordingDialer();
  for (const [answer, classes] of cases) {
    await t.step(`${answer}: ${classes}`, async () => {
      for (const mode of ["allowlist", "full"] as const) {
        await using h = await ProxyHarness.start({
          mode,
          allow: ["app.test"],
          resolve: new ScriptedResolver(() => [answer]).resolve,
          localAddresses: () => ["127.0.0.1", OWN],
          dial: dialer.dial,
        });
        const response = await exchange(h, connectRequest("app.test:443"));
        assert.equal(statusOf(response), 403, `${mode}: ${response}`);
        assert.equal(bodyOf(response), internalNameBody("app.test:443", classes));
      }
    });
  }
  assert.deepEqual(dialer.dialled, []);
  assert.equal(echo.accepted, 0);

  await t.step("positive twin: a public answer is dialled, by address", async () => {
    const twin = new RecordingDialer(echo.port);
    await using h = await ProxyHarness.start({
      allow: ["app.test"],
      resolve: new ScriptedResolver(() => [PUBLIC]).resolve,
      localAddresses: () => ["127.0.0.1", OWN],
      dial: twin.dial,
    });
    const conn = await h.connect();
    try {
      await writeText(conn, connectRequest("app.test:443") + "ping");
      assert.equal(await readUntil(conn, "ping"), ESTABLISHED + "ping");
    } finally {
      closeQuietly(conn);
    }
    assert.deepEqual(twin.dialled, [`${PUBLIC} 443`]);
    const [entry] = await h.entriesLogged(1);
    assert.equal(entry.address, PUBLIC);
  });
});

Deno.test("startEgressProxy() resolves once and connects to the address it checked, so a rebinding DNS answer is never used", async (t) => {
  await using echo = new EchoServer();
  await using web = new WebServer();

  for (const path of ["CONNECT", "plain HTTP"] as const) {
    await t.step(`${path}: first answer public, any later one 127.0.0.1`, async () => {
      const rebinding = new ScriptedResolver((_, n) => n === 1 ? [PUBLIC] : ["127.0.0.1"]);
      const dialer = new RecordingDialer(path === "CONNECT" ? echo.port : web.port);
      await using h = await ProxyHarness.start({
        allow: ["rebind.test"],
        resolve: rebinding.resolve,
        dial: dialer.dial,
      });
      if (path === "CONNECT") {
        const conn = await h.connect();
        try {
          await writeText(conn, connectRequest("rebind.test:443") + "ping");
          assert.equal(await readUntil(conn, "ping"), ESTABLISHED + "ping");
        } finally {
          closeQuietly(conn);
        }
      } else {
        const response = await exchange(h, "GET http://rebind.test/ HTTP/1.1\r\n\r\n");
        assert.equal(statusOf(response), 200, response);
        assert.equal(web.requests.at(-1)?.headers.get("host"), "rebind.test");
      }
      assert.deepEqual(rebinding.lookups, ["rebind.test"]);
      const port = path === "CONNECT" ? 443 : 80;
      assert.deepEqual(dialer.dialled, [`${PUBLIC} ${port}`]);
      const [entry] = await h.entriesLogged(1);
      assert.deepEqual([entry.decision, entry.status, entry.address], ["allow", 200, PUBLIC]);
    });
  }

  await t.step(
    "an answer mixing internal and public addresses connects only to the public one",
    async () => {
      const dialer = new RecordingDialer(echo.port);
      const resolver = new ScriptedResolver(() => ["127.0.0.1", "10.0.0.1", PUBLIC, "::1"]);
      await using h = await ProxyHarness.start({
        allow: ["mixed.test"],
        resolve: resolver.resolve,
        dial: dialer.dial,
      });
      const conn = await h.connect();
      try {
        await writeText(conn, connectRequest("mixed.test:443") + "ping");
        assert.equal(await readUntil(conn, "ping"), ESTABLISHED + "ping");
      } finally {
        closeQuietly(conn);
      }
      assert.deepEqual(dialer.dialled, [`${PUBLIC} 443`]);
      assert.equal(resolver.lookups.length, 1);
    },
  );
});

Deno.test("startEgressProxy() refuses an internal IP literal target in every spelling a client accepts", async (t) => {
  await using echo = new EchoServer();
  await using web = new WebServer();
  const port = echo.port;
  const resolver = new ScriptedResolver(() => [PUBLIC]);
  await using h = await ProxyHarness.start({
    // Listed literally, in the canonical spellings, so that the allowlist is not what refuses.
    allow: [
      `127.0.0.1:${port}`,
      `[::1]:${port}`,
      `[::ffff:7f00:1]:${port}`,
      `169.254.169.254:${port}`,
      `127.0.0.1:${web.port}`,
    ],
    resolve: resolver.resolve,
  });
  const cases: [spelling: string, canonical: string, classes: string][] = [
    ["127.0.0.1", "127.0.0.1", "a loopback address"],
    ["2130706433", "127.0.0.1", "a loopback address"],
    ["0x7f.1", "127.0.0.1", "a loopback address"],
    ["127.1", "127.0.0.1", "a loopback address"],
    ["0177.0.0.1", "127.0.0.1", "a loopback address"],
    ["0x7f000001", "127.0.0.1", "a loopback address"],
    ["[::1]", "[::1]", "a loopback address"],
    ["[0:0:0:0:0:0:0:1]", "[::1]", "a loopback address"],
    ["[::ffff:127.0.0.1]", "[::ffff:7f00:1]", "a loopback address (IPv4-mapped IPv6)"],
    ["169.254.169.254", "169.254.169.254", "a cloud metadata address"],
    ["2852039166", "169.254.169.254", "a cloud metadata address"],
  ];
  for (const [spelling, canonical, classes] of cases) {
    await t.step(`CONNECT ${spelling}`, async () => {
      const response = await exchange(h, connectRequest(`${spelling}:${port}`));
      assert.equal(statusOf(response), 403, response);
      assert.equal(bodyOf(response), internalLiteralBody(`${canonical}:${port}`, classes));
    });
  }
  await t.step("plain HTTP to a numeric spelling of loopback", async () => {
    const response = await exchange(h, `GET http://2130706433:${web.port}/ HTTP/1.1\r\n\r\n`);
    assert.equal(statusOf(response), 403, response);
    assert.equal(
      bodyOf(response),
      internalLiteralBody(`127.0.0.1:${web.port}`, "a loopback address"),
    );
  });
  assert.equal(echo.accepted, 0);
  assert.equal(web.requests.length, 0);
  // A literal is checked as it is, never looked up.
  assert.deepEqual(resolver.lookups, []);
});

Deno.test("startEgressProxy() with the system resolver refuses an allowlisted localhost", async () => {
  await using echo = new EchoServer();
  // `localhost` comes from /etc/hosts through getaddrinfo, as any name would: no DNS server.
  await using h = await ProxyHarness.start({
    allow: [`localhost:${echo.port}`],
    resolve: undefined,
  });
  const response = await exchange(h, connectRequest(`localhost:${echo.port}`));
  assert.equal(statusOf(response), 403, response);
  assert.match(
    bodyOf(response),
    /"localhost:\d+" resolved to an internal address \(a loopback address/,
  );
  assert.match(bodyOf(response), /network\.hosts/);
  assert.equal(echo.accepted, 0);
});

Deno.test("startEgressProxy() answers 502 when the allowed name does not resolve in time or at all", async (t) => {
  await t.step("no such name", async () => {
    await using h = await ProxyHarness.start({
      allow: ["gone.test"],
      resolve: () => Promise.reject(Object.assign(new Error("ENOTFOUND"), { name: "NotFound" })),
    });
    const response = await exchange(h, connectRequest("gone.test:443"));
    assert.equal(statusOf(response), 502, response);
    assert.equal(bodyOf(response), 'sandbox egress proxy: cannot resolve "gone.test": NotFound\n');
  });
  await t.step("a resolver that never answers", async () => {
    await using h = await ProxyHarness.start({
      allow: ["slow.test"],
      connectTimeoutMs: 100,
      resolve: (_, signal) =>
        new Promise((_, reject) => signal.addEventListener("abort", () => reject(signal.reason))),
    });
    const response = await exchange(h, connectRequest("slow.test:443"));
    assert.equal(statusOf(response), 502, response);
    assert.equal(
      bodyOf(response),
      'sandbox egress proxy: cannot resolve "slow.test": no answer within 100 ms\n',
    );
  });
});

Deno.test("startEgressProxy() rejects a network.hosts entry that is not an IP address", async () => {
  await assert.rejects(
    startEgressProxy({
      hostnames: ["127.0.0.1"],
      mode: "allowlist",
      allow: ["a.test"],
      hosts: { "a.test": "abc" },
      profile: "p",
    }),
    TypeError,
    'Invalid hosts entry "a.test": "abc" is not an IP address',
  );
});
