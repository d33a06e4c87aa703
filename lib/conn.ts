/** Small helpers for the host's socket conversations (the spare relay's, the engine's). */

/**
 * A line, newline included, within `max` bytes (and `timeoutMs`, when given: then the connection
 * is closed); else null: too long, more than a line, cut short, or late. Read in chunks: the
 * peers this reads from say nothing after such a line until they are answered.
 */
export async function readLine(
  conn: Deno.Conn,
  max: number,
  timeoutMs?: number,
): Promise<Uint8Array | null> {
  const buffer = new Uint8Array(max);
  let filled = 0;
  const timer = timeoutMs === undefined
    ? undefined
    : setTimeout(() => closeQuietly(conn), timeoutMs);
  try {
    while (filled < max) {
      const n = await conn.read(buffer.subarray(filled));
      if (n === null) return null;
      filled += n;
      const newline = buffer.subarray(0, filled).indexOf(10);
      if (newline >= 0) return newline === filled - 1 ? buffer.slice(0, filled) : null;
    }
    return null;
  } catch {
    return null;
  } finally {
    clearTimeout(timer);
  }
}

/** Write all of `bytes`. */
export async function writeAll(conn: Deno.Conn, bytes: Uint8Array): Promise<void> {
  let rest = bytes;
  while (rest.length > 0) rest = rest.subarray(await conn.write(rest));
}

/** Close, whether or not it still is open. */
export function closeQuietly(conn: { close(): void }): void {
  try {
    conn.close();
  } catch {
    // Already closed.
  }
}
