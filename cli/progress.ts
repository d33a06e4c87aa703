/**
 * Progress on stderr. A slow phase (building an image) is one line when it begins and one when it
 * ends, with its elapsed time; on a terminal the begin line carries a spinner and a running clock
 * until the end line replaces it. Other stderr lines clear the spinner first and redraw it after.
 */
import { isGoneOutput } from "../lib/output.ts";
import { escapeControls } from "../lib/run/transcript.ts";

const encoder = new TextEncoder();
const FRAMES = ["⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"];
const TICK_MS = 120;

interface Active {
  line: string;
  started: number;
  frame: number;
  timer: ReturnType<typeof setInterval>;
}

let active: Active | undefined;

function write(text: string): void {
  try {
    Deno.stderr.writeSync(encoder.encode(text));
  } catch (error) {
    // A terminal gone under a supervised run: the spinner has no one to show to.
    if (!isGoneOutput(error)) throw error;
  }
}

function terminal(): boolean {
  return Deno.stderr.isTerminal() && !Deno.env.get("NO_COLOR") && Deno.env.get("TERM") !== "dumb";
}

/** Columns of the terminal; a spinner line must fit in one, or `\r` cannot redraw it. */
function columns(): number {
  try {
    return Deno.consoleSize().columns;
  } catch {
    return 80;
  }
}

function render(): void {
  if (!active) return;
  const elapsed = ` ${Math.floor((performance.now() - active.started) / 1000)}s`;
  const head = `${FRAMES[active.frame++ % FRAMES.length]} sandbox: `;
  const room = Math.max(10, columns() - 1 - head.length - elapsed.length);
  const line = active.line.length > room ? `${active.line.slice(0, room - 1)}…` : active.line;
  write(`\r\x1b[2K${head}${line}${elapsed}`);
}

/** Take the spinner line off the screen (before another line is written). */
export function clearSpinner(): void {
  if (active) write("\r\x1b[2K");
}

/** Put the spinner back after another line was written. */
export function redrawSpinner(): void {
  render();
}

/** End the spinner for good, leaving nothing of it on the screen. */
export function stopSpinner(): void {
  if (!active) return;
  clearInterval(active.timer);
  clearSpinner();
  active = undefined;
}

/**
 * A progress line: `phase` "begin" starts a spinner (on a terminal) that the next "end" line
 * replaces; without a phase, a plain line.
 */
export function progress(text: string, phase?: "begin" | "end"): void {
  // A line can quote what the agent made (a ref name) or a remote said: controls shown escaped.
  const line = escapeControls(text);
  stopSpinner();
  if (phase === "begin" && terminal()) {
    const timer = setInterval(render, TICK_MS);
    Deno.unrefTimer(timer);
    active = { line, started: performance.now(), frame: 0, timer };
    render();
    return;
  }
  write(`sandbox: ${line}\n`);
}
