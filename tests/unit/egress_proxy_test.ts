import assert from "node:assert/strict";
import { AccessLog, type AccessLogEntry } from "../../lib/proxy/access_log.ts";
import {
  type EgressProxy,
  type EgressProxyOptions,
  startEgressProxy,
} from "../../lib/proxy/egress_proxy.ts";

const encoder = new TextEncoder();
const decoder = new TextDecoder();

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
      ...options,
    });
    return harness;
  }

  /** A raw TCP connection to the proxy. */
  connect(): Promise<Deno.Conn> {
    return Deno.connect({ hostname: "127.0.0.1", port: this.proxy.port });
  }

  /** Resolves once `count` entries were logged in total (entries are written when connections end). */
  entriesLogged(count: number): Promise<AccessLogEntry[]> {
    if (this.entries.length >= count) return Promise.resolve(this.entries);
    return new Promise((resolve) =>
      this.#waiters.push({ count, resolve: () => resolve(this.entries) })
    );
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
async function readUntil(conn: Deno.Conn, marker: string, soFar = ""): Promise<string> {
  let text = soFar;
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
}

/** Read until the other side closes. */
async function readToEnd(conn: Deno.Conn): Promise<string> {
  let text = "";
  const buffer = new Uint8Array(16 * 1024);
  while (true) {
    const n = await conn.read(buffer);
    if (n === null) return text;
    text += decoder.decode(buffer.subarray(0, n), { stream: true });
  }
}

/** Send `request` on a new connection and return everything the proxy answers. */
async function exchange(harness: ProxyHarness, request: string): Promise<string> {
  const conn = await harness.connect();
  try {
    await writeText(conn, request);
    return await readToEnd(conn);
  } finally {
    conn.close();
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
    conn.close();
  }

  const [entry] = await h.entriesLogged(1);
  assert.deepEqual({ ...entry, time: undefined, durationMs: undefined }, {
    time: undefined,
    kind: "egress",
    decision: "allow",
    method: "CONNECT",
    host: "echo.test",
    port: echo.port,
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
    conn.close();
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
      conn.close();
    }
    assert.equal(statusOf(await exchange(h, connectRequest(`echo.test:${echo.port}`))), 403);
  });

  await t.step("an IP literal is allowed only when listed, in any spelling", async () => {
    await using h = await ProxyHarness.start({ allow: [`127.0.0.1:${echo.port}`] });
    for (const host of ["127.0.0.1", "2130706433"]) {
      const conn = await h.connect();
      try {
        await writeText(conn, connectRequest(`${host}:${echo.port}`));
        assert.equal(await readUntil(conn, "\r\n\r\n"), ESTABLISHED, host);
      } finally {
        conn.close();
      }
    }
    assert.equal(statusOf(await exchange(h, connectRequest(`127.0.0.1:${closedPort()}`))), 403);
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
    conn.close();
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
    assert.equal(await readToEnd(conn).catch(() => ""), "");
  } finally {
    conn.close();
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
  await assert.rejects(
    Deno.connect({ hostname: "127.0.0.1", port: proxy.port }),
    Deno.errors.ConnectionRefused,
  );
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
