/**
 * The egress proxy keeps idle plain-HTTP upstream connections for later requests, whichever client
 * connection they come on, without ever letting one destination's connection carry another's
 * request, and without reusing a connection whose last exchange did not end cleanly. The upstream
 * is a raw HTTP/1.1 server on loopback that numbers the connections it accepts and names, in every
 * body, the connection and the path it answered, so that each response can be matched to its
 * request.
 */
import assert from "node:assert/strict";
import { type EgressProxy, startEgressProxy } from "../../lib/proxy/egress_proxy.ts";

const encoder = new TextEncoder();
const decoder = new TextDecoder();
/** Every wait has a deadline, so that a regression fails naming what never came. */
const DEADLINE_MS = 10_000;
const REQUESTS = 500;
const MAX_CONNECTIONS = 5;

/**
 * Answers `GET /PATH` with `conn N /PATH` (Content-Length), except:
 * - `/close`: the same, with `Connection: close`, yet the socket is kept open (the proxy must go
 *   by the header, not by the upstream closing);
 * - `/unframed`: a body without length, ended by closing;
 * - `/bye`: an ordinary answer, then the connection is closed as an idle timeout would;
 * - `/arm`: an ordinary answer, then the next request on the connection is met by closing it
 *   unanswered (an upstream that closed the idle connection just as the request was sent).
 */
class CountingUpstream implements AsyncDisposable {
  accepted = 0;
  readonly #listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  readonly #conns = new Set<Deno.Conn>();
  readonly #serving = new Set<Promise<void>>();
  readonly #accepting: Promise<void>;

  constructor() {
    this.#accepting = this.#accept();
  }

  get port(): number {
    return this.#listener.addr.port;
  }

  async #accept(): Promise<void> {
    try {
      for await (const conn of this.#listener) {
        const id = ++this.accepted;
        this.#conns.add(conn);
        const serving = this.#serve(conn, id).finally(() => this.#serving.delete(serving));
        this.#serving.add(serving);
      }
    } catch {
      // The listener was closed by dispose.
    }
  }

  async #serve(conn: Deno.Conn, id: number): Promise<void> {
    let pending = "";
    let armed = false;
    const buffer = new Uint8Array(16 * 1024);
    try {
      while (true) {
        const end = pending.indexOf("\r\n\r\n");
        if (end === -1) {
          const n = await conn.read(buffer);
          if (n === null) return;
          pending += decoder.decode(buffer.subarray(0, n));
          continue;
        }
        const path = pending.slice(0, end).split(" ")[1];
        pending = pending.slice(end + 4);
        if (armed) return;
        armed = path === "/arm";
        const body = `conn ${id} ${path}`;
        if (path === "/unframed") {
          await write(conn, `HTTP/1.1 200 OK\r\n\r\n${body}`);
          return;
        }
        const close = path === "/close" ? "Connection: close\r\n" : "";
        await write(
          conn,
          `HTTP/1.1 200 OK\r\nContent-Length: ${body.length}\r\n${close}\r\n${body}`,
        );
        if (path === "/bye") return;
      }
    } catch {
      // Closed by dispose, or reset by the proxy.
    } finally {
      this.#conns.delete(conn);
      closeQuietly(conn);
    }
  }

  async [Symbol.asyncDispose](): Promise<void> {
    closeQuietly(this.#listener);
    for (const conn of this.#conns) closeQuietly(conn);
    await this.#accepting;
    await Promise.allSettled([...this.#serving]);
  }
}

async function write(conn: Deno.Conn, text: string): Promise<void> {
  let bytes = encoder.encode(text);
  while (bytes.length > 0) bytes = bytes.subarray(await conn.write(bytes));
}

function closeQuietly(resource: { close(): void }): void {
  try {
    resource.close();
  } catch {
    // Already closed.
  }
}

/** The proxy, allowing `web.test` and `other.test` on the upstream's port, both mapped to it. */
function startProxy(upstream: CountingUpstream): Promise<EgressProxy> {
  return startEgressProxy({
    hostnames: ["127.0.0.1"],
    mode: "allowlist",
    allow: [`web.test:${upstream.port}`, `other.test:${upstream.port}`],
    hosts: { "web.test": "127.0.0.1", "other.test": "127.0.0.1" },
    profile: "pool",
    resolve: (name) => Promise.reject(new Error(`unexpected lookup of "${name}"`)),
  });
}

/**
 * `GET http://HOST/PATH` on a client connection of its own (HTTP/1.1, kept-alive as far as the
 * client is concerned), read to the end of its response; the connection is then closed.
 */
async function getOnce(
  proxy: EgressProxy,
  host: string,
  path: string,
): Promise<{ status: number; body: string }> {
  const conn = await Deno.connect({
    hostname: "127.0.0.1",
    port: proxy.port,
    signal: AbortSignal.timeout(DEADLINE_MS),
  });
  const timer = setTimeout(() => closeQuietly(conn), DEADLINE_MS);
  try {
    await write(conn, `GET http://${host}${path} HTTP/1.1\r\nHost: ${host}\r\n\r\n`);
    let text = "";
    const buffer = new Uint8Array(16 * 1024);
    while (true) {
      const end = text.indexOf("\r\n\r\n");
      const length = end === -1 ? undefined : /\r\ncontent-length: (\d+)/i.exec(text.slice(0, end));
      if (length && text.length >= end + 4 + Number(length[1])) {
        const status = Number(/^HTTP\/1\.1 (\d{3})/.exec(text)?.[1]);
        return { status, body: text.slice(end + 4, end + 4 + Number(length[1])) };
      }
      const n = await conn.read(buffer);
      if (n === null) {
        const status = Number(/^HTTP\/1\.1 (\d{3})/.exec(text)?.[1]);
        return { status, body: end === -1 ? "" : text.slice(end + 4) };
      }
      text += decoder.decode(buffer.subarray(0, n));
    }
  } finally {
    clearTimeout(timer);
    closeQuietly(conn);
  }
}

/** The upstream connection number a body names, after checking that it answers `path`. */
function connectionOf(response: { status: number; body: string }, path: string): number {
  assert.equal(response.status, 200, response.body);
  const match = /^conn (\d+) (\S+)$/.exec(response.body);
  assert.ok(match, `unexpected body "${response.body}"`);
  assert.equal(match[2], path, "a response delivered to another request");
  return Number(match[1]);
}

Deno.test(`egress proxy: ${REQUESTS} requests, each on a new client connection, to one allowed upstream open at most ${MAX_CONNECTIONS} upstream connections`, async () => {
  await using upstream = new CountingUpstream();
  await using proxy = await startProxy(upstream);
  const web = `web.test:${upstream.port}`;
  for (let i = 0; i < REQUESTS; i++) {
    connectionOf(await getOnce(proxy, web, `/r${i}`), `/r${i}`);
  }
  assert.ok(
    upstream.accepted <= MAX_CONNECTIONS,
    `${upstream.accepted} upstream connections for ${REQUESTS} requests`,
  );
});

Deno.test("egress proxy: requests for two allowed destinations at the same address never share an upstream connection", async () => {
  await using upstream = new CountingUpstream();
  await using proxy = await startProxy(upstream);
  const used = { "web.test": new Set<number>(), "other.test": new Set<number>() };
  for (let i = 0; i < 10; i++) {
    for (const name of ["web.test", "other.test"] as const) {
      const path = `/${name}/${i}`;
      used[name].add(connectionOf(await getOnce(proxy, `${name}:${upstream.port}`, path), path));
    }
  }
  // The twin: each destination's own requests did reuse its connection.
  assert.ok(used["web.test"].size < 10 && used["other.test"].size < 10, JSON.stringify(used));
  const shared = [...used["web.test"]].filter((id) => used["other.test"].has(id));
  assert.deepEqual(shared, [], "an upstream connection carried requests for both destinations");
});

Deno.test("egress proxy: an upstream connection whose response said Connection: close, or had no length, is not reused", async (t) => {
  await using upstream = new CountingUpstream();
  await using proxy = await startProxy(upstream);
  const web = `web.test:${upstream.port}`;

  await t.step(
    "twin: after an ordinary response the next request rides the same connection",
    async () => {
      const first = connectionOf(await getOnce(proxy, web, "/keep"), "/keep");
      assert.equal(connectionOf(await getOnce(proxy, web, "/next"), "/next"), first);
    },
  );

  await t.step(
    "Connection: close (the upstream keeping its socket open all the same)",
    async () => {
      const closing = connectionOf(await getOnce(proxy, web, "/close"), "/close");
      const next = connectionOf(await getOnce(proxy, web, "/after-close"), "/after-close");
      assert.notEqual(next, closing, "a request rode a connection the upstream said it closes");
    },
  );

  await t.step("a body ended by the upstream closing", async () => {
    const response = await getOnce(proxy, web, "/unframed");
    assert.equal(response.status, 200);
    const unframed = Number(/^conn (\d+) \/unframed$/.exec(response.body)?.[1]);
    assert.ok(unframed > 0, response.body);
    const next = connectionOf(await getOnce(proxy, web, "/after-unframed"), "/after-unframed");
    assert.notEqual(next, unframed);
  });
});

Deno.test("egress proxy: a pooled connection the upstream closed while idle costs the next request nothing", async () => {
  await using upstream = new CountingUpstream();
  await using proxy = await startProxy(upstream);
  const web = `web.test:${upstream.port}`;
  for (let i = 0; i < 5; i++) {
    const bye = connectionOf(await getOnce(proxy, web, "/bye"), "/bye");
    const next = connectionOf(await getOnce(proxy, web, `/after-bye${i}`), `/after-bye${i}`);
    assert.notEqual(next, bye);
  }
});

Deno.test("egress proxy: a GET that a pooled connection drops unanswered is sent again on a new connection", async (t) => {
  await using upstream = new CountingUpstream();
  await using proxy = await startProxy(upstream);
  const web = `web.test:${upstream.port}`;
  const armed = connectionOf(await getOnce(proxy, web, "/arm"), "/arm");
  const retried = connectionOf(await getOnce(proxy, web, "/after-arm"), "/after-arm");
  assert.notEqual(retried, armed);

  await t.step("twin: a POST dropped the same way is not sent again", async () => {
    connectionOf(await getOnce(proxy, web, "/arm"), "/arm");
    const before = upstream.accepted;
    const conn = await Deno.connect({ hostname: "127.0.0.1", port: proxy.port });
    try {
      await write(conn, `POST http://${web}/once HTTP/1.1\r\nHost: ${web}\r\n\r\n`);
      const timer = setTimeout(() => closeQuietly(conn), DEADLINE_MS);
      let answer = "";
      const buffer = new Uint8Array(1024);
      try {
        for (let n; (n = await conn.read(buffer)) !== null;) {
          answer += decoder.decode(buffer.subarray(0, n));
        }
      } finally {
        clearTimeout(timer);
      }
      assert.doesNotMatch(answer, /conn \d+ \/once/, "the POST was sent again");
      assert.equal(upstream.accepted, before);
    } finally {
      closeQuietly(conn);
    }
  });
});
