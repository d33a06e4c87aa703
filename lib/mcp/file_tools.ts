/**
 * The file tools of `sandbox mcp`: read, write, list and search, each confined to the
 * environment's checkout inside its sandbox (confine.ts).
 */
import type { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { z } from "zod";
import { addTool, type Environments, jsonResult, onEnvironment } from "./server.ts";

/** Bounds of the file tools' answers. */
export const FILE_LIMITS = {
  readBytes: 256 * 1024,
  maxReadBytes: 4 * 1024 * 1024,
  listEntries: 1000,
  maxDepth: 10,
  searchLines: 200,
  maxSearchLines: 5000,
} as const;

const CONFINED =
  "Paths are relative to the checkout (or absolute inside it); a path that leads out of the " +
  "checkout, through `..` or a symlink, is refused.";

export function registerFileTools(server: McpServer, environments: Environments): void {
  registerReadWriteTools(server, environments);
  registerFindTools(server, environments);
}

/** environment_read_file, environment_write_file. */
function registerReadWriteTools(server: McpServer, environments: Environments): void {
  const id = z.string().min(1).describe("from environment_open");
  addTool(server, "environment_read_file", {
    description:
      `Read a text file of the environment's checkout (the first max_bytes bytes, default ${FILE_LIMITS.readBytes}). ${CONFINED}`,
    inputSchema: {
      environment_id: id,
      path: z.string().min(1),
      max_bytes: z.number().int().positive().max(FILE_LIMITS.maxReadBytes).optional(),
    },
  }, (input, extra) =>
    onEnvironment(environments, {
      tool: "environment_read_file",
      id: input.environment_id,
      input,
    }, async (env) => {
      const read = await env.readFile(input.path, {
        maxBytes: input.max_bytes ?? FILE_LIMITS.readBytes,
        signal: extra.signal,
      });
      const shown = new TextEncoder().encode(read.text).byteLength;
      const note = read.sizeBytes > shown
        ? `\n[cut: ${shown} of ${read.sizeBytes} bytes shown; pass max_bytes for more]`
        : "";
      return { content: [{ type: "text", text: read.text + note }] };
    }));
  addTool(server, "environment_write_file", {
    description:
      `Write a file in the environment's checkout (created or replaced; parent directories made). ${CONFINED}`,
    inputSchema: { environment_id: id, path: z.string().min(1), content: z.string() },
  }, (input, extra) =>
    onEnvironment(environments, {
      tool: "environment_write_file",
      id: input.environment_id,
      input: {
        environment_id: input.environment_id,
        path: input.path,
        bytes: input.content.length,
      },
    }, async (env) => {
      await env.writeFile(input.path, input.content, extra.signal);
      return jsonResult({
        written: input.path,
        bytes: new TextEncoder().encode(input.content).byteLength,
      });
    }));
}

/** environment_list_files, environment_search. */
function registerFindTools(server: McpServer, environments: Environments): void {
  const id = z.string().min(1).describe("from environment_open");
  addTool(server, "environment_list_files", {
    description:
      `List the files and directories under a directory of the checkout (.git left out), depth levels deep (default 2). ${CONFINED}`,
    inputSchema: {
      environment_id: id,
      path: z.string().min(1).optional().describe("default: the checkout"),
      depth: z.number().int().min(1).max(FILE_LIMITS.maxDepth).optional(),
    },
  }, (input, extra) =>
    onEnvironment(environments, {
      tool: "environment_list_files",
      id: input.environment_id,
      input,
    }, async (env) =>
      jsonResult(
        await env.list(input.path ?? ".", {
          depth: input.depth ?? 2,
          maxEntries: FILE_LIMITS.listEntries,
          signal: extra.signal,
        }),
      )));
  addTool(server, "environment_search", {
    description:
      `Search the checkout's text files for a pattern (grep -E, or fixed strings), under path (default: the checkout). Returns "path:line:text" lines. ${CONFINED}`,
    inputSchema: {
      environment_id: id,
      pattern: z.string().min(1),
      path: z.string().min(1).optional(),
      fixed_strings: z.boolean().optional(),
      ignore_case: z.boolean().optional(),
      max_lines: z.number().int().positive().max(FILE_LIMITS.maxSearchLines).optional(),
    },
  }, (input, extra) =>
    onEnvironment(
      environments,
      { tool: "environment_search", id: input.environment_id, input },
      async (env) =>
        jsonResult(
          await env.search(input.pattern, {
            path: input.path ?? ".",
            fixed: input.fixed_strings === true,
            ignoreCase: input.ignore_case === true,
            maxLines: input.max_lines ?? FILE_LIMITS.searchLines,
            signal: extra.signal,
          }),
        ),
    ));
}
