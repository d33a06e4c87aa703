/**
 * The git proxy against a fake remote on 127.0.0.1: which request targets name an endpoint, what
 * a push's command section may contain, and that what reaches the remote is exactly what was
 * checked — streamed, never held whole. Raw HTTP (not `fetch`, which normalises URLs) carries the
 * ambiguous targets, so the proxy sees the bytes an attacker would send.
 */
import assert from "node:assert/strict";
import { AccessLog, type AccessLogEntry } from "../../lib/proxy/access_log.ts";
import { parseGitRoute, requestTarget, scanPushCommands } from "../../lib/proxy/git_protocol.ts";
import { Redactor } from "../../lib/redact.ts";
import {
  type GitRemote,
  MAX_COMMAND_BYTES,
  parseRefUpdates,
  pushViolation,
  startGitProxy,
} from "../../lib/proxy/git_proxy.ts";

const enc = new TextEncoder();
const OLD = "1".repeat(40);
const NEW = "2".repeat(40);
const ZERO = "0".repeat(40);
const RUN_REF = "refs/heads/sandbox/run-1";
const DEADLINE_MS = 10_000;

function pkt(line: string): string {
  return (enc.encode(line).byteLength + 4).toString(16).padStart(4, "0") + line;
}

function rawPkt(payload: Uint8Array): Uint8Array {
  return concat(enc.encode((payload.byteLength + 4).toString(16).padStart(4, "0")), payload);
}

function pushBody(...lines: string[]): Uint8Array<ArrayBuffer> {
  return enc.encode(lines.map(pkt).join("") + "0000" + "PACK....");
}

function concat(...parts: Uint8Array[]): Uint8Array<ArrayBuffer> {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.byteLength, 0));
  let at = 0;
  for (const part of parts) {
    out.set(part, at);
    at += part.byteLength;
  }
  return out;
}

async function gzip(bytes: Uint8Array): Promise<Uint8Array> {
  return await new Response(
    new Blob([bytes as BlobPart]).stream().pipeThrough(new CompressionStream("gzip")),
  ).bytes();
}

/** Reject after `ms` unless `promise` settles first (a regression fails by name, never hangs). */
async function within<T>(promise: Promise<T>, what: string, ms = DEADLINE_MS): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  try {
    return await Promise.race([
      promise,
      new Promise<never>((_, reject) =>
        timer = setTimeout(() => reject(new Error(`timed out: ${what}`)), ms)
      ),
    ]);
  } finally {
    clearTimeout(timer);
  }
}

Deno.test("parseGitRoute() accepts exactly the three smart-HTTP endpoints, service from the path", async (t) => {
  const ok: [string, string, string, string][] = [
    [
      "GET",
      "/git/info/refs?service=git-upload-pack",
      "git-upload-pack",
      "/info/refs?service=git-upload-pack",
    ],
    [
      "GET",
      "/git/info/refs?service=git-receive-pack",
      "git-receive-pack",
      "/info/refs?service=git-receive-pack",
    ],
    ["POST", "/git/git-upload-pack", "git-upload-pack", "/git-upload-pack"],
    ["POST", "/git/git-receive-pack", "git-receive-pack", "/git-receive-pack"],
  ];
  for (const [method, target, service, suffix] of ok) {
    await t.step(`${method} ${target}`, () => {
      const decided = parseGitRoute(method, target, "/git");
      assert.ok(decided.ok, JSON.stringify(decided));
      assert.equal(decided.route.service, service);
      assert.equal(decided.route.suffix, suffix);
    });
  }
  const refused: [string, string, number][] = [
    // The query-string bypass: a POST's service is its path; any query is refused.
    ["POST", "/git/git-receive-pack?service=git-upload-pack", 400],
    ["POST", "/git/git-upload-pack?service=git-receive-pack", 400],
    ["POST", "/git/git-receive-pack?", 400],
    ["POST", "/git/git-receive-pack?x=1", 400],
    ["POST", "/git/git-receive-pack?%73ervice=git-upload-pack", 400],
    // info/refs: the query's service is its only input, and must be exactly one of the two.
    ["GET", "/git/info/refs", 400],
    ["GET", "/git/info/refs?", 400],
    ["GET", "/git/info/refs?service=git-upload-pack&service=git-receive-pack", 400],
    ["GET", "/git/info/refs?service=git-receive-pack&x=1", 400],
    ["GET", "/git/info/refs?x=1&service=git-upload-pack", 400],
    ["GET", "/git/info/refs?service=git-upload-pack%00", 400],
    ["GET", "/git/info/refs?service=git-upload-archive", 400],
    ["GET", "/git/info/refs?service=GIT-UPLOAD-PACK", 400],
    // Ambiguous encodings of a path.
    ["POST", "/git/git-receive-pack%2F", 400],
    ["POST", "/git/git%2dreceive-pack", 400],
    ["POST", "/git/x/../git-receive-pack", 400],
    ["POST", "/git/./git-receive-pack", 400],
    ["POST", "/git//git-receive-pack", 400],
    ["POST", "/git/%2e%2e/git-receive-pack", 400],
    ["POST", "/git/git-receive-pack;service=git-upload-pack", 400],
    ["POST", "/git/git\\git-receive-pack", 400],
    ["GET", "/git/info/refs#?service=git-upload-pack", 400],
    ["GET", "/git/info/refs?service=git-upload-pack#x", 400],
    ["GET", "/git/info/refs?service=git-upload-pack ", 400],
    ["GET", "git/info/refs?service=git-upload-pack", 400],
    ["GET", "*", 400],
    // Other paths and trailing junk.
    ["POST", "/git/git-receive-pack/", 404],
    ["POST", "/git/git-receive-packx", 404],
    ["POST", "/git/git-receive-pack.git", 404],
    ["POST", "/git-receive-pack", 404],
    ["POST", "/git/sub/git-receive-pack", 404],
    ["POST", "/gitx/git-receive-pack", 404],
    ["POST", "/git/git-upload-archive", 404],
    ["GET", "/git/HEAD", 404],
    ["GET", "/git/objects/info/packs", 404],
    ["GET", "/git/info/refs/", 404],
    ["GET", "/git", 404],
    ["GET", "/git/", 404],
    // Wrong methods on the right paths.
    ["POST", "/git/info/refs?service=git-upload-pack", 405],
    ["HEAD", "/git/info/refs?service=git-upload-pack", 405],
    ["GET", "/git/git-receive-pack", 405],
    ["PUT", "/git/git-receive-pack", 405],
    ["GET", "/git/git-upload-pack", 405],
  ];
  for (const [method, target, status] of refused) {
    await t.step(`${method} ${target} is refused with ${status}`, () => {
      const decided = parseGitRoute(method, target, "/git");
      assert.equal(decided.ok, false, `accepted: ${JSON.stringify(decided)}`);
      assert.equal(!decided.ok && decided.status, status, JSON.stringify(decided));
    });
  }
  await t.step("requestTarget() keeps the sandbox's own text of path and query", () => {
    assert.equal(
      requestTarget("http://10.0.0.1:8080/git/x/../y?service=a"),
      "/git/x/../y?service=a",
    );
    assert.equal(requestTarget("http://[::1]:80/git/info/refs"), "/git/info/refs");
  });
});

Deno.test("scanPushCommands() reads every ref update before the flush, capabilities stripped", () => {
  const body = pushBody(
    `${OLD} ${NEW} refs/heads/run\0report-status side-band-64k\n`,
    `${ZERO} ${NEW} refs/tags/v1\n`,
  );
  const commands = scanPushCommands(body)!;
  assert.deepEqual(commands.updates, [
    { old: OLD, new: NEW, ref: "refs/heads/run" },
    { old: ZERO, new: NEW, ref: "refs/tags/v1" },
  ]);
  assert.deepEqual(commands.capabilities, ["report-status", "side-band-64k"]);
  assert.equal(new TextDecoder().decode(body.subarray(commands.end)), "PACK....");
  assert.deepEqual(parseRefUpdates(body), commands.updates);
});

Deno.test("scanPushCommands() asks for more bytes until the flush, wherever the chunk boundary falls", () => {
  const body = pushBody(`${OLD} ${NEW} ${RUN_REF}\0report-status\n`, `shallow ${OLD}\n`);
  const end = scanPushCommands(body)!.end;
  for (let cut = 0; cut < end; cut++) {
    assert.equal(scanPushCommands(body.subarray(0, cut)), undefined, `cut at ${cut}`);
  }
  assert.equal(scanPushCommands(body.subarray(0, end))?.end, end);
  assert.throws(() => parseRefUpdates(body.subarray(0, end - 1)), /truncated/);
});

Deno.test("scanPushCommands() reads as receive-pack does, refusing what git would read otherwise", async (t) => {
  const sha256Old = "a".repeat(64);
  const sha256New = "b".repeat(64);
  await t.step("SHA-256 object ids", () => {
    assert.deepEqual(parseRefUpdates(pushBody(`${sha256Old} ${sha256New} ${RUN_REF}\n`)), [{
      old: sha256Old,
      new: sha256New,
      ref: RUN_REF,
    }]);
  });
  await t.step(
    "shallow lines are skipped; agent, object-format and session-id capabilities pass",
    () => {
      const body = pushBody(
        `shallow ${OLD}\n`,
        `${OLD} ${NEW} ${RUN_REF}\0report-status-v2 quiet atomic agent=git/2.39 object-format=sha1 session-id=x\n`,
      );
      assert.deepEqual(parseRefUpdates(body), [{ old: OLD, new: NEW, ref: RUN_REF }]);
    },
  );
  await t.step(
    "the ref name is the rest of the line, spaces included (as queue_command reads it)",
    () => {
      assert.deepEqual(parseRefUpdates(pushBody(`${OLD} ${NEW} ${RUN_REF} refs/heads/main\n`)), [{
        old: OLD,
        new: NEW,
        ref: `${RUN_REF} refs/heads/main`,
      }]);
    },
  );
  await t.step("only one trailing LF is chomped from the packet, before the NUL", () => {
    assert.deepEqual(parseRefUpdates(pushBody(`${OLD} ${NEW} ${RUN_REF}\n\0report-status`)), [{
      old: OLD,
      new: NEW,
      ref: `${RUN_REF}\n`,
    }]);
  });
  const malformed: [string, Uint8Array, RegExp][] = [
    ["a non-hex length", enc.encode("zzzz"), /length/],
    ["a length parseInt would half-read", enc.encode(`00a\n${"x".repeat(20)}`), /length/],
    ["a signed length", enc.encode(`+0a1${"x".repeat(200)}`), /length/],
    [
      "a delimiter packet, which ends git's list like a flush",
      enc.encode(`0001${pkt(`${OLD} ${NEW} refs/heads/main\n`)}0000`),
      /special packet/,
    ],
    [
      "a response-end packet",
      enc.encode(`0002${pkt(`${OLD} ${NEW} refs/heads/main\n`)}0000`),
      /special packet/,
    ],
    [
      "an empty packet, which git also reads as the end",
      enc.encode(`0004${pkt(`${OLD} ${NEW} refs/heads/main\n`)}0000`),
      /special packet/,
    ],
    ["a missing ref", pushBody(`${OLD} ${NEW}\n`), /malformed ref update/],
    [
      "ids of two lengths",
      pushBody(`${OLD} ${"b".repeat(64)} ${RUN_REF}\n`),
      /malformed ref update/,
    ],
    [
      "upper-case ids",
      pushBody(`${OLD.toUpperCase()} ${"A".repeat(40)} ${RUN_REF}\n`),
      /malformed ref update/,
    ],
    [
      "a push certificate",
      pushBody(`push-cert\0report-status\n`, "certificate version 0.1\n"),
      /push-cert/,
    ],
    [
      "push options",
      pushBody(`${OLD} ${NEW} ${RUN_REF}\0report-status push-options\n`),
      /push options/,
    ],
    [
      "push options named on a later line",
      pushBody(
        `${OLD} ${NEW} ${RUN_REF}\0report-status\n`,
        `${OLD} ${NEW} ${RUN_REF}\0push-options\n`,
      ),
      /push options/,
    ],
    [
      "an unknown capability",
      pushBody(`${OLD} ${NEW} ${RUN_REF}\0report-status x-unknown\n`),
      /capability "x-unknown"/,
    ],
    ["a malformed shallow line", pushBody(`shallow xyz\n`), /malformed "shallow xyz"/],
    [
      "a ref that is not UTF-8",
      concat(
        rawPkt(concat(enc.encode(`${OLD} ${NEW} refs/heads/`), new Uint8Array([0xff, 0xfe, 0x0a]))),
        enc.encode("0000"),
      ),
      /UTF-8/,
    ],
    [
      "a pkt-line longer than git reads",
      enc.encode(`fff1${"x".repeat(0xfff1)}0000`),
      /pkt-line of/,
    ],
  ];
  for (const [what, body, message] of malformed) {
    await t.step(`refuses ${what}`, () => assert.throws(() => scanPushCommands(body), message));
  }
});

Deno.test("pushViolation() allows exactly one update of the granted branch, and nothing without a grant", () => {
  assert.equal(pushViolation([{ old: OLD, new: NEW, ref: RUN_REF }], RUN_REF), undefined);
  assert.equal(
    pushViolation([{ old: ZERO, new: NEW, ref: RUN_REF }], RUN_REF),
    undefined,
    "creating the run branch",
  );
  assert.match(pushViolation([{ old: OLD, new: NEW, ref: RUN_REF }], false) ?? "", /no push grant/);
  assert.match(
    pushViolation([{ old: OLD, new: NEW, ref: "refs/heads/main" }], RUN_REF) ?? "",
    /refs\/heads\/main/,
  );
  assert.match(
    pushViolation([{ old: OLD, new: NEW, ref: "refs/for/main" }], RUN_REF) ?? "",
    /refs\/for\/main/,
  );
  assert.match(
    pushViolation([{ old: OLD, new: NEW, ref: `${RUN_REF}\n` }], RUN_REF) ?? "",
    /\\x0a/,
  );
  assert.match(
    pushViolation([{ old: OLD, new: NEW, ref: RUN_REF }, {
      old: ZERO,
      new: NEW,
      ref: "refs/tags/x",
    }], RUN_REF) ?? "",
    /refs\/tags\/x/,
  );
  assert.match(pushViolation([{ old: OLD, new: ZERO, ref: RUN_REF }], RUN_REF) ?? "", /deleting/);
  assert.match(
    pushViolation([{ old: OLD, new: "0".repeat(64), ref: RUN_REF }], RUN_REF) ?? "",
    /deleting/,
  );
  assert.match(
    pushViolation(
      [{ old: OLD, new: NEW, ref: RUN_REF }, { old: NEW, new: OLD, ref: RUN_REF }],
      RUN_REF,
    ) ?? "",
    /2 updates/,
  );
  assert.match(pushViolation([], RUN_REF) ?? "", /no ref updates/);
});

interface Seen {
  method: string;
  target: string;
  headers: Headers;
  body: Uint8Array;
}

/** A fake remote that records what reached it; `hold` lets a test steer the handler. */
class FakeRemote implements AsyncDisposable {
  readonly seen: Seen[] = [];
  /** Replace to take over a request (streaming tests). */
  handler: ((req: Request) => Promise<Response>) | undefined;
  readonly #server: Deno.HttpServer<Deno.NetAddr>;

  constructor() {
    this.#server = Deno.serve(
      { hostname: "127.0.0.1", port: 0, onListen: () => {} },
      async (req) => {
        if (this.handler) return await this.handler(req);
        const body = new Uint8Array(await req.arrayBuffer());
        this.seen.push({
          method: req.method,
          target: requestTarget(req.url),
          headers: req.headers,
          body,
        });
        return new Response("remote answer", {
          headers: { "content-type": "application/x-git-result" },
        });
      },
    );
  }

  get url(): string {
    return `http://127.0.0.1:${this.#server.addr.port}/repo.git`;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.#server.shutdown();
  }
}

async function proxyFor(
  remote: FakeRemote,
  push: string | false,
  entries: AccessLogEntry[] = [],
  commandTimeoutMs = 5_000,
) {
  const grant: GitRemote = {
    url: remote.url,
    authorization: () => Promise.resolve("Basic c2VjcmV0"),
    push,
  };
  const proxy = await startGitProxy({
    hostnames: ["127.0.0.1"],
    grants: new Map([["sbx_token", grant]]),
    log: new AccessLog({ onEntry: (entry) => entries.push(entry) }),
    profile: "p",
    runId: "run-1",
    commandTimeoutMs,
  });
  return proxy;
}

const AUTH = { authorization: "Bearer sbx_token" };
const RECEIVE = { ...AUTH, "content-type": "application/x-git-receive-pack-request" };

/** One raw HTTP/1.1 request (the target exactly as given); the status and body of the answer. */
async function raw(
  port: number,
  method: string,
  target: string,
  headers: Record<string, string>,
  body = new Uint8Array(),
) {
  const conn = await Deno.connect({ hostname: "127.0.0.1", port });
  const timer = setTimeout(() => conn.close(), DEADLINE_MS);
  try {
    const head = [
      `${method} ${target} HTTP/1.1`,
      "host: sandbox",
      "connection: close",
      `content-length: ${body.byteLength}`,
    ]
      .concat(Object.entries(headers).map(([k, v]) => `${k}: ${v}`)).join("\r\n") + "\r\n\r\n";
    await conn.write(concat(enc.encode(head), body));
    const text = new TextDecoder().decode(await new Response(conn.readable).bytes());
    const status = Number(/^HTTP\/1\.1 (\d{3})/.exec(text)?.[1]);
    assert.ok(status, `no HTTP answer (timed out?): ${JSON.stringify(text)}`);
    return { status, body: text.slice(text.indexOf("\r\n\r\n") + 4) };
  } finally {
    clearTimeout(timer);
    try {
      conn.close();
    } catch { /* closed by the read */ }
  }
}

Deno.test("the git proxy refuses requests without the session token and pushes to other refs, forwarding neither", async () => {
  await using remote = new FakeRemote();
  await using proxy = await proxyFor(remote, RUN_REF);
  const base = proxy.url("127.0.0.1");
  const anonymous = await fetch(`${base}/info/refs?service=git-upload-pack`);
  await anonymous.body?.cancel();
  assert.equal(anonymous.status, 401);

  const push = (ref: string) =>
    fetch(`${base}/git-receive-pack`, {
      method: "POST",
      headers: RECEIVE,
      body: pushBody(`${OLD} ${NEW} ${ref}\0report-status\n`) as BodyInit,
    });
  const refused = await push("refs/heads/main");
  assert.equal(refused.status, 403);
  assert.match(await refused.text(), /may push only "refs\/heads\/sandbox\/run-1"/);
  assert.equal(remote.seen.length, 0);

  const allowed = await push(RUN_REF);
  assert.equal(allowed.status, 200);
  assert.equal(await allowed.text(), "remote answer");
  assert.equal(remote.seen.length, 1);
  assert.equal(remote.seen[0].headers.get("authorization"), "Basic c2VjcmV0");
});

Deno.test("the git proxy never forwards a POST whose query names a service, and logs its whole target", async () => {
  await using remote = new FakeRemote();
  const entries: AccessLogEntry[] = [];
  await using proxy = await proxyFor(remote, RUN_REF, entries);
  // A push that rewrites main, deletes a branch and creates a tag, presented as a fetch.
  const attack = pushBody(
    `${OLD} ${NEW} refs/heads/main\0report-status\n`,
    `${OLD} ${ZERO} refs/heads/dev\n`,
    `${ZERO} ${NEW} refs/tags/v9\n`,
  );
  for (
    const target of [
      "/git/git-receive-pack?service=git-upload-pack",
      "/git/git-upload-pack?service=git-receive-pack",
    ]
  ) {
    const answer = await raw(proxy.port, "POST", target, RECEIVE, attack);
    assert.equal(answer.status, 400, answer.body);
    assert.match(answer.body, /a query on POST git-(receive|upload)-pack/);
  }
  // The positive twin: the same bytes on the plain path are read as the push they are, and refused for their refs.
  const plain = await raw(proxy.port, "POST", "/git/git-receive-pack", RECEIVE, attack);
  assert.equal(plain.status, 403, plain.body);
  assert.match(plain.body, /refs\/heads\/main/);
  assert.equal(remote.seen.length, 0);
  assert.deepEqual(entries.map((e) => [e.decision, e.status, e.target]), [
    ["deny", 400, "/git/git-receive-pack?service=git-upload-pack"],
    ["deny", 400, "/git/git-upload-pack?service=git-receive-pack"],
    ["deny", 403, "/git/git-receive-pack"],
  ]);
});

Deno.test("the git proxy refuses ambiguous targets and other endpoints before reading the body, forwarding nothing", async () => {
  await using remote = new FakeRemote();
  await using proxy = await proxyFor(remote, RUN_REF);
  const push = pushBody(`${OLD} ${NEW} ${RUN_REF}\0report-status\n`);
  const cases: [string, string, number][] = [
    ["POST", "/git/x/../git-receive-pack", 400],
    ["POST", "/git//git-receive-pack", 400],
    ["POST", "/git/git-receive-pack%2f", 400],
    ["POST", "/git/%67it-receive-pack", 400],
    ["POST", "/git/git-receive-pack/", 404],
    ["GET", "/git/HEAD", 404],
    ["GET", "/git/info/refs", 400],
    ["PUT", "/git/git-receive-pack", 405],
  ];
  for (const [method, target, status] of cases) {
    const answer = await raw(proxy.port, method, target, RECEIVE, push);
    assert.equal(answer.status, status, `${method} ${target}: ${answer.body}`);
    assert.match(answer.body, /^sandbox git proxy: /);
  }
  assert.equal(remote.seen.length, 0);
  // The positive twin, through the same raw client.
  const ok = await raw(proxy.port, "POST", "/git/git-receive-pack", RECEIVE, push);
  assert.equal(ok.status, 200, ok.body);
  assert.equal(remote.seen.length, 1);
  assert.equal(remote.seen[0].target, "/repo.git/git-receive-pack");
});

Deno.test("without a push grant, receive-pack is refused (advertisement and push, even of the run branch); fetches work", async () => {
  await using remote = new FakeRemote();
  await using proxy = await proxyFor(remote, false);
  const base = proxy.url("127.0.0.1");
  const advert = await fetch(`${base}/info/refs?service=git-receive-pack`, { headers: AUTH });
  assert.equal(advert.status, 403);
  assert.match(await advert.text(), /no push grant/);
  const push = await fetch(`${base}/git-receive-pack`, {
    method: "POST",
    headers: RECEIVE,
    body: pushBody(`${OLD} ${NEW} ${RUN_REF}\0report-status\n`) as BodyInit,
  });
  assert.equal(push.status, 403);
  assert.match(await push.text(), /no push grant/);
  assert.equal(remote.seen.length, 0);

  const fetchAdvert = await fetch(`${base}/info/refs?service=git-upload-pack`, {
    headers: { ...AUTH, "git-protocol": "version=2" },
  });
  assert.equal(fetchAdvert.status, 200);
  await fetchAdvert.body?.cancel();
  assert.equal(remote.seen.length, 1);
  assert.equal(remote.seen[0].target, "/repo.git/info/refs?service=git-upload-pack");
  assert.equal(remote.seen[0].headers.get("git-protocol"), "version=2");
});

Deno.test("a gzip-encoded push is checked on its decoded commands, and the remote receives exactly the checked bytes", async () => {
  await using remote = new FakeRemote();
  await using proxy = await proxyFor(remote, RUN_REF);
  const base = proxy.url("127.0.0.1");
  const send = async (body: Uint8Array, encoding = "gzip") =>
    await fetch(`${base}/git-receive-pack`, {
      method: "POST",
      headers: { ...RECEIVE, "content-encoding": encoding },
      body: await gzip(body) as BodyInit,
    });

  const refused = await send(pushBody(`${OLD} ${NEW} refs/heads/main\0report-status\n`));
  assert.equal(refused.status, 403);
  assert.match(await refused.text(), /refs\/heads\/main/);
  const deflate = await send(pushBody(`${OLD} ${NEW} ${RUN_REF}\0report-status\n`), "deflate");
  assert.equal(deflate.status, 415);
  await deflate.body?.cancel();
  const garbage = await fetch(`${base}/git-receive-pack`, {
    method: "POST",
    headers: { ...RECEIVE, "content-encoding": "gzip" },
    body: "not gzip at all",
  });
  assert.ok(garbage.status === 400 || garbage.status === 403, String(garbage.status));
  await garbage.body?.cancel();
  assert.equal(remote.seen.length, 0);

  const plain = pushBody(`${OLD} ${NEW} ${RUN_REF}\0report-status\n`);
  const allowed = await send(plain);
  assert.equal(allowed.status, 200);
  await allowed.body?.cancel();
  assert.equal(remote.seen.length, 1);
  assert.deepEqual(remote.seen[0].body, plain);
  assert.equal(remote.seen[0].headers.get("content-encoding"), null);
});

Deno.test("receive-pack requests with the wrong content type, a v2 header or oversized commands are handled without forwarding them as sent", async () => {
  await using remote = new FakeRemote();
  await using proxy = await proxyFor(remote, RUN_REF);
  const base = proxy.url("127.0.0.1");
  const body = pushBody(`${OLD} ${NEW} ${RUN_REF}\0report-status\n`);
  const wrongType = await fetch(`${base}/git-receive-pack`, {
    method: "POST",
    headers: { ...AUTH, "content-type": "application/x-git-upload-pack-request" },
    body: body as BodyInit,
  });
  assert.equal(wrongType.status, 415);
  await wrongType.body?.cancel();

  const huge = pushBody(
    `${OLD} ${NEW} ${RUN_REF}\0report-status\n`,
    ...Array.from({ length: MAX_COMMAND_BYTES / 50 }, () => `shallow ${OLD}\n`),
  );
  const tooLong = await fetch(`${base}/git-receive-pack`, {
    method: "POST",
    headers: RECEIVE,
    body: huge as BodyInit,
  });
  assert.equal(tooLong.status, 413);
  assert.match(await tooLong.text(), /exceeds/);
  assert.equal(remote.seen.length, 0);

  // Receive-pack has no protocol v2: the header is not forwarded, so the remote speaks v0, the format checked.
  const v2 = await fetch(`${base}/git-receive-pack`, {
    method: "POST",
    headers: { ...RECEIVE, "git-protocol": "version=2" },
    body: body as BodyInit,
  });
  assert.equal(v2.status, 200);
  await v2.body?.cancel();
  assert.equal(remote.seen.length, 1);
  assert.equal(remote.seen[0].headers.get("git-protocol"), null);
});

Deno.test("a push whose command section never completes is refused at the deadline, not held open", async () => {
  await using remote = new FakeRemote();
  await using proxy = await proxyFor(remote, RUN_REF, [], 300);
  const conn = await Deno.connect({ hostname: "127.0.0.1", port: proxy.port });
  try {
    const partial = pkt(`${OLD} ${NEW} ${RUN_REF}\0report-status\n`);
    await conn.write(enc.encode(
      `POST /git/git-receive-pack HTTP/1.1\r\nhost: s\r\nauthorization: Bearer sbx_token\r\ncontent-type: application/x-git-receive-pack-request\r\ncontent-length: 100000\r\n\r\n${partial}`,
    ));
    const reader = conn.readable.getReader();
    const first = await within(reader.read(), "the proxy's answer to a stalled push");
    reader.releaseLock();
    assert.match(new TextDecoder().decode(first.value), /^HTTP\/1\.1 408/);
  } finally {
    conn.close();
  }
  assert.equal(remote.seen.length, 0);
});

Deno.test("the git proxy streams a push's pack and the remote's answer instead of holding them", async () => {
  await using remote = new FakeRemote();
  await using proxy = await proxyFor(remote, RUN_REF);
  const headSeen = Promise.withResolvers<Uint8Array>();
  const firstAnswerRead = Promise.withResolvers<void>();
  const packEnded = Promise.withResolvers<number>();
  remote.handler = (req) => {
    // Answer as soon as the head arrives; finish the answer only after the sandbox read its start.
    const reader = req.body!.getReader();
    (async () => {
      let total = 0;
      let first = true;
      while (true) {
        const { value, done } = await reader.read();
        if (done) break;
        if (first) headSeen.resolve(value);
        first = false;
        total += value.byteLength;
      }
      packEnded.resolve(total);
    })().catch(packEnded.reject);
    const answer = new ReadableStream<Uint8Array>({
      async start(controller) {
        controller.enqueue(enc.encode("first "));
        await firstAnswerRead.promise;
        await packEnded.promise.catch(() => {});
        controller.enqueue(enc.encode("second"));
        controller.close();
      },
    });
    return Promise.resolve(new Response(answer));
  };
  const head = pushBody(`${OLD} ${NEW} ${RUN_REF}\0report-status\n`);
  const chunk = new Uint8Array(1024 * 1024).fill(7);
  // 8 MiB after the head: a proxy that held the body would never forward the head (see below).
  const PACK_CHUNKS = 8;
  const released = Promise.withResolvers<void>();
  let sent = 0;
  const body = new ReadableStream<Uint8Array>({
    async pull(controller) {
      if (sent === 0) {
        controller.enqueue(head);
        sent++;
        // The rest of the pack is sent only once the remote has the head: a proxy that held the
        // whole body before forwarding would never get there.
        await released.promise;
        return;
      }
      if (sent > PACK_CHUNKS) return controller.close();
      controller.enqueue(chunk);
      sent++;
    },
  });
  const response = within(
    fetch(`${proxy.url("127.0.0.1")}/git-receive-pack`, { method: "POST", headers: RECEIVE, body }),
    "the proxy's response",
  );
  const seenHead = await within(
    headSeen.promise,
    "the remote receiving the command section before the pack was sent",
  );
  assert.ok(
    new TextDecoder().decode(seenHead).startsWith(new TextDecoder().decode(head.subarray(0, 20))),
  );
  released.resolve();
  const answer = await response;
  const reader = answer.body!.getReader();
  const start = await within(reader.read(), "the first part of the remote's answer");
  assert.equal(new TextDecoder().decode(start.value), "first ");
  firstAnswerRead.resolve();
  let rest = "";
  while (true) {
    const { value, done } = await within(reader.read(), "the rest of the answer");
    if (done) break;
    rest += new TextDecoder().decode(value);
  }
  assert.equal(rest, "second");
  assert.equal(
    await within(packEnded.promise, "the end of the pack"),
    head.byteLength + PACK_CHUNKS * chunk.byteLength,
  );
});

Deno.test("a failing credential source is a 502 that names no secret, and nothing reaches the remote", async () => {
  await using remote = new FakeRemote();
  const secret = "ghp_secretsecretsecret0123456789";
  const redactor = new Redactor();
  redactor.add(secret);
  const entries: AccessLogEntry[] = [];
  await using proxy = await startGitProxy({
    hostnames: ["127.0.0.1"],
    grants: new Map([["sbx_token", {
      url: remote.url,
      authorization: () => Promise.reject(new Error(`helper printed ${secret}`)),
      push: false,
    }]]),
    log: new AccessLog({ onEntry: (entry) => entries.push(entry), redactor }),
    redactor,
    profile: "p",
    runId: null,
  });
  const answer = await fetch(`${proxy.url("127.0.0.1")}/info/refs?service=git-upload-pack`, {
    headers: AUTH,
  });
  assert.equal(answer.status, 502);
  assert.ok(!(await answer.text()).includes(secret));
  assert.equal(remote.seen.length, 0);
  assert.equal(entries.length, 1);
  assert.equal(entries[0].status, 502);
  assert.ok(!JSON.stringify(entries).includes(secret), JSON.stringify(entries));
});
