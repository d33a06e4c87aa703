/**
 * Idle upstream connections of one egress proxy, kept for the next plain-HTTP request to the same
 * destination (whichever client connection it comes on).
 *
 * - A connection is taken only by its own key (the canonical host and port it was opened for), so
 *   a request never rides a connection opened for another destination. The proxy that owns the
 *   pool serves one session (one run), so nothing is shared between runs.
 * - At most `maxIdle` are kept (the least recently used goes first), each for at most
 *   `idleTimeoutMs`.
 * - While idle, each connection is watched: anything it sends or its end (the upstream closing
 *   it) discards it, since no request is waiting for those bytes.
 */

/** What the pool keeps: a connection, the destination it serves, and how to watch it. */
export interface PooledUpstream {
  /** The destination: only a request for the same key takes it. */
  readonly key: string;
  /**
   * Settles when the connection reads anything or ends while idle. Called once per stay in the
   * pool; the read it starts is the next reader's (it must not be lost when the connection is
   * taken before it settles).
   */
  watchIdle(): Promise<unknown>;
}

export interface UpstreamPoolOptions<T extends PooledUpstream> {
  /** 0: nothing is kept. */
  maxIdle: number;
  idleTimeoutMs: number;
  /** Close a connection the pool lets go of (evicted, expired, or at `clear()`). */
  discard: (upstream: T) => void;
}

interface Stay {
  timer: ReturnType<typeof setTimeout>;
}

export class UpstreamPool<T extends PooledUpstream> {
  readonly #options: UpstreamPoolOptions<T>;
  /** Insertion order: the least recently returned first. */
  readonly #idle = new Map<T, Stay>();

  constructor(options: UpstreamPoolOptions<T>) {
    this.#options = options;
  }

  get size(): number {
    return this.#idle.size;
  }

  /** The most recently returned idle connection for `key`, removed from the pool; or undefined. */
  take(key: string): T | undefined {
    let found: T | undefined;
    for (const upstream of this.#idle.keys()) if (upstream.key === key) found = upstream;
    if (found === undefined) return undefined;
    clearTimeout(this.#idle.get(found)!.timer);
    this.#idle.delete(found);
    return found;
  }

  /** Keep `upstream` (which ended its last exchange cleanly) for a next request to its key. */
  put(upstream: T): void {
    if (this.#options.maxIdle <= 0) return this.#options.discard(upstream);
    while (this.#idle.size >= this.#options.maxIdle) {
      this.#evict(this.#idle.keys().next().value!, undefined);
    }
    const timer = setTimeout(() => this.#evict(upstream, stay), this.#options.idleTimeoutMs);
    // An idle connection never keeps the process alive.
    Deno.unrefTimer(timer);
    const stay: Stay = { timer };
    this.#idle.set(upstream, stay);
    const gone = () => this.#evict(upstream, stay);
    upstream.watchIdle().then(gone, gone);
  }

  /** Close every idle connection. */
  clear(): void {
    for (const upstream of [...this.#idle.keys()]) this.#evict(upstream, undefined);
  }

  /** Let go of `upstream` if it is still in the pool (for the stay `stay`, when given). */
  #evict(upstream: T, stay: Stay | undefined): void {
    const current = this.#idle.get(upstream);
    // Taken (and maybe returned again) since: this stay's timer or watcher is stale.
    if (current === undefined || (stay !== undefined && current !== stay)) return;
    clearTimeout(current.timer);
    this.#idle.delete(upstream);
    this.#options.discard(upstream);
  }
}
