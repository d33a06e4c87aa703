/**
 * Splitting untrusted byte streams into lines, with a cap on line length.
 *
 * Output from inside a sandbox is untrusted: a process that prints gigabytes without a newline
 * must not make the host buffer gigabytes. A line longer than the cap is an error, not a silent
 * truncation, because every consumer of lines here (NDJSON, logs) would misread a cut line.
 */

/** Default cap on one line: 16 MiB, far above any legitimate NDJSON event. */
export const MAX_LINE_CHARS = 16 * 1024 * 1024;

/** A line exceeded the cap given to `LineSplitStream`. */
export class LineTooLongError extends RangeError {
  override name = "LineTooLongError";
  constructor(readonly maxChars: number) {
    super(`Line longer than ${maxChars} characters`);
  }
}

/**
 * Splits decoded text into lines on `\n` (a preceding `\r` is dropped). A final line without a
 * newline is emitted at the end of the stream.
 */
export class LineSplitStream extends TransformStream<string, string> {
  constructor(maxChars = MAX_LINE_CHARS) {
    let pending = "";
    super({
      transform(chunk, controller) {
        pending += chunk;
        let start = 0;
        let newline: number;
        while ((newline = pending.indexOf("\n", start)) !== -1) {
          const end = newline > start && pending[newline - 1] === "\r" ? newline - 1 : newline;
          if (end - start > maxChars) throw new LineTooLongError(maxChars);
          controller.enqueue(pending.slice(start, end));
          start = newline + 1;
        }
        pending = pending.slice(start);
        if (pending.length > maxChars) throw new LineTooLongError(maxChars);
      },
      flush(controller) {
        if (pending.length > 0) controller.enqueue(pending);
      },
    });
  }
}

/** Lines of a byte stream, decoded as UTF-8. */
export function readLines(
  bytes: ReadableStream<Uint8Array>,
  maxChars = MAX_LINE_CHARS,
): ReadableStream<string> {
  return bytes.pipeThrough(new TextDecoderStream()).pipeThrough(new LineSplitStream(maxChars));
}
