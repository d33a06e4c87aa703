/**
 * A loopback upstream in front of a `FakeLlm` that can hold one request until the test releases
 * it: the run then sits, live, between two events for as long as the test needs.
 */
import { FakeLlm, type FakeStep } from "./_fake_llm.ts";

export class HeldLlm implements AsyncDisposable {
  readonly fake: FakeLlm;
  readonly #server: Deno.HttpServer<Deno.NetAddr>;
  #count = 0;
  #holdAt = 0;
  #arrived = Promise.withResolvers<string>();
  #released = Promise.withResolvers<void>();

  constructor(script: FakeStep[]) {
    this.fake = new FakeLlm(script);
    this.#server = Deno.serve(
      { hostname: "127.0.0.1", port: 0, onListen: () => {} },
      async (req) => {
        const n = ++this.#count;
        const body = await req.arrayBuffer();
        if (n === this.#holdAt) {
          this.#arrived.resolve(new TextDecoder().decode(body));
          await this.#released.promise;
        }
        const url = new URL(req.url);
        return await fetch(`http://127.0.0.1:${this.fake.port}${url.pathname}${url.search}`, {
          method: req.method,
          headers: req.headers,
          body: body.byteLength ? body : undefined,
        });
      },
    );
  }

  get baseUrl(): string {
    return `http://127.0.0.1:${this.#server.addr.port}/v1`;
  }

  /**
   * Hold the `n`-th request (1-based); resolves with its body once it has arrived (the body
   * carries the tool results of the previous turn).
   */
  hold(n: number): Promise<string> {
    this.#holdAt = n;
    return this.#arrived.promise;
  }

  release(): void {
    this.#released.resolve();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    this.release();
    await this.#server.shutdown();
    await this.fake[Symbol.asyncDispose]();
  }
}
