/**
 * The viewers' protocol: between a session's supervisor (supervisor.ts) and the `sandbox shell` /
 * `sandbox attach` processes that show it, over the session's Unix socket
 * (`<state>/sessions/ID/viewers.sock`, in a 0700 directory, the socket 0600: only the user).
 * One JSON object per line each way; terminal bytes are base64.
 *
 * | from     | message                                   | meaning                                          |
 * |----------|-------------------------------------------|--------------------------------------------------|
 * | viewer   | `{t:"hello", role, rows, cols}`           | first line; `role` "writer" or "viewer"          |
 * | super.   | `{t:"welcome", role}`                     | the role granted: a second writer is a viewer    |
 * | super.   | `{t:"out", data}`                         | what the terminal showed (the tail first: redraw)|
 * | writer   | `{t:"in", data}`                          | typed bytes                                      |
 * | writer   | `{t:"resize", rows, cols}`                | the writer's window changed                      |
 * | any      | `{t:"stop"}`                              | end the session (its program and sandbox)        |
 * | super.   | `{t:"exit", code}`                        | the program ended with `code`; the socket closes |
 */
import { SandboxError } from "../errors.ts";
import { userStateDir } from "../paths.ts";
import type { AgentCliName } from "../agents/packages.ts";
import type { ProjectConfigPath } from "../agents/project_config.ts";
import type { ShellRepo } from "./shell_repo.ts";

export type Role = "writer" | "viewer";

export type ViewerMessage =
  | { t: "hello"; role: Role; rows: number; cols: number }
  | { t: "in"; data: string }
  | { t: "resize"; rows: number; cols: number }
  | { t: "stop" };

export type SupervisorMessage =
  | { t: "welcome"; role: Role }
  | { t: "out"; data: string }
  | { t: "exit"; code: number };

/** Only the user may enter the session's directory and connect to its socket. */
export const SESSION_DIR_MODE = 0o700;
export const VIEWERS_SOCKET_MODE = 0o600;
/** How much of the terminal's latest output a new viewer is sent to redraw its screen. */
export const REDRAW_BYTES = 64 * 1024;
/** The longest line either end accepts (a base64 chunk of output is far below it). */
export const MAX_LINE_CHARS = 1024 * 1024;

export function sessionsDir(): string {
  return `${userStateDir()}/sessions`;
}

export function sessionDir(id: string): string {
  if (!/^[\w.-]+$/.test(id)) {
    throw new SandboxError("usage", `Invalid session id "${id}"`);
  }
  return `${sessionsDir()}/${id}`;
}

export function viewersSocket(id: string): string {
  return `${sessionDir(id)}/viewers.sock`;
}

/** What the CLI asks the supervisor to start (`spec.json` in the session's directory). */
export interface SessionSpec {
  id: string;
  profile?: string;
  config?: string;
  /** The program to run with a terminal (default: a login shell). */
  argv: string[];
  rows: number;
  cols: number;
  term: string;
  /** `--repo`: the shell starts in its checkout, whose commits come back as a branch. */
  repo?: ShellRepo;
  /**
   * `run agentic --interactive`: the program is this agent CLI's TUI (lib/agents/interactive.ts),
   * from its image layer, instead of `argv`.
   */
  agent?: SessionAgent;
}

export interface SessionAgent {
  name: AgentCliName;
  /** `-m`; default: the profile's model. */
  model?: string;
  /** The repository's configuration for the agent that the user trusts (checked by the CLI). */
  trustedConfig: ProjectConfigPath[];
}

export function encodeBytes(bytes: Uint8Array): string {
  let text = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    text += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  }
  return btoa(text);
}

export function decodeBytes(text: string): Uint8Array {
  const raw = atob(text);
  const bytes = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
  return bytes;
}

/** A message line's object, or undefined when it is not one this protocol knows. */
export function parseMessage<T extends { t: string }>(line: string): T | undefined {
  try {
    const value = JSON.parse(line) as unknown;
    if (typeof value === "object" && value !== null && typeof (value as T).t === "string") {
      return value as T;
    }
  } catch {
    // Not JSON: refused like any unknown message.
  }
  return undefined;
}

/** A window size from a peer, clamped to what a terminal can be. */
export function clampSize(rows: unknown, cols: unknown): { rows: number; cols: number } {
  const clamp = (n: unknown, fallback: number) =>
    typeof n === "number" && Number.isInteger(n) && n > 0 ? Math.min(n, 1000) : fallback;
  return { rows: clamp(rows, 24), cols: clamp(cols, 80) };
}
