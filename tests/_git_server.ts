/**
 * A real git smart-HTTP server for tests: `git http-backend` (CGI) behind `Deno.serve` on
 * 127.0.0.1, serving bare repositories under a temp root and requiring a token (HTTP Basic,
 * any user name). It records what it saw, so tests can check the token arrived from the proxy.
 */
import { spawn } from "../lib/process.ts";

export class GitHttpServer implements AsyncDisposable {
  readonly root: string;
  readonly token: string;
  /** Authorization headers received, in order. */
  readonly authorizations: (string | null)[] = [];
  readonly #server: Deno.HttpServer<Deno.NetAddr>;

  constructor(root: string, token: string) {
    this.root = root;
    this.token = token;
    this.#server = Deno.serve(
      { hostname: "127.0.0.1", port: 0, onListen: () => {} },
      (req) => this.#handle(req),
    );
  }

  /** URL of repository `name` (a bare repository `<root>/<name>`). */
  url(name: string): string {
    return `http://127.0.0.1:${this.#server.addr.port}/${name}`;
  }

  async #handle(req: Request): Promise<Response> {
    const auth = req.headers.get("authorization");
    this.authorizations.push(auth);
    const password = auth?.startsWith("Basic ")
      ? atob(auth.slice(6)).split(":").slice(1).join(":")
      : undefined;
    if (password !== this.token) {
      await req.body?.cancel();
      return new Response("auth required\n", {
        status: 401,
        headers: { "www-authenticate": 'Basic realm="test"' },
      });
    }
    const url = new URL(req.url);
    const body = new Uint8Array(await req.arrayBuffer());
    const child = spawn(["git", "http-backend"], {
      stdin: body,
      env: {
        GIT_PROJECT_ROOT: this.root,
        GIT_HTTP_EXPORT_ALL: "1",
        REQUEST_METHOD: req.method,
        PATH_INFO: url.pathname,
        QUERY_STRING: url.search.replace(/^\?/, ""),
        CONTENT_TYPE: req.headers.get("content-type") ?? "",
        CONTENT_LENGTH: String(body.byteLength),
        HTTP_CONTENT_ENCODING: req.headers.get("content-encoding") ?? "",
        GIT_PROTOCOL: req.headers.get("git-protocol") ?? "",
        REMOTE_USER: "tester",
        REMOTE_ADDR: "127.0.0.1",
      },
    });
    const [raw] = await Promise.all([new Response(child.stdout).bytes(), child.finished]);
    // CGI output: headers, a blank line, the (binary) body.
    let end = -1;
    let skip = 0;
    for (let i = 0; i < raw.length - 1; i++) {
      if (raw[i] === 10 && raw[i + 1] === 10) {
        end = i;
        skip = 2;
        break;
      }
      if (raw[i] === 13 && raw[i + 1] === 10 && raw[i + 2] === 13 && raw[i + 3] === 10) {
        end = i;
        skip = 4;
        break;
      }
    }
    const headers = new Headers();
    let status = 200;
    for (const line of new TextDecoder().decode(raw.subarray(0, Math.max(end, 0))).split(/\r?\n/)) {
      const colon = line.indexOf(":");
      if (colon < 0) continue;
      const name = line.slice(0, colon).trim();
      const value = line.slice(colon + 1).trim();
      if (name.toLowerCase() === "status") status = Number.parseInt(value);
      else headers.set(name, value);
    }
    return new Response(raw.subarray(end + skip), { status, headers });
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.#server.shutdown();
  }
}
