/**
 * The `yaml` package, loaded when a configuration file has to be parsed rather than when the
 * program starts. It is a CommonJS package, and the first CommonJS module costs Deno's start
 * ~35 ms; a run whose configuration is in the parse cache (config_cache.ts), or that has no
 * configuration file, never needs it.
 *
 * By default the module is loaded eagerly (a top-level await in config.ts), so that the
 * synchronous `parseConfig()` works for every library user and test as before. The CLI defers it:
 * its first import (cli/defer_yaml.ts) calls `deferYaml()` before config.ts is evaluated, and every
 * CLI path that parses YAML awaits `loadYaml()` first.
 */
import type YamlModule from "yaml";

export type Yaml = typeof YamlModule;

let deferred = false;
let loaded: Yaml | undefined;
let loading: Promise<Yaml> | undefined;

/** Do not load `yaml` until `loadYaml()` is called (the CLI's start-up). */
export function deferYaml(): void {
  deferred = true;
}

/** Whether `deferYaml()` was called. */
export function yamlDeferred(): boolean {
  return deferred;
}

/** Load (once) and return the `yaml` module. */
export function loadYaml(): Promise<Yaml> {
  loading ??= import("yaml").then((module) => loaded = module.default);
  return loading;
}

/** The `yaml` module, which must have been loaded (`await loadYaml()`). */
export function yaml(): Yaml {
  if (!loaded) {
    throw new Error("Internal error: the yaml module is used before loadYaml() finished");
  }
  return loaded;
}

/**
 * A YAML document as plain data, or what is wrong with it (configuration issues' messages, each
 * naming the kind of problem: `YAML syntax: ...`, `YAML alias: ...`).
 */
export type YamlDocument = { kind: "ok"; value: unknown } | { kind: "invalid"; errors: string[] };

/**
 * At most this many alias expansions, weighted by what each expands to (the `yaml` module's
 * count): a document whose aliases multiply (an "alias bomb", billion laughs) is refused instead
 * of growing without bound. Hand-written configuration uses a handful.
 */
export const MAX_YAML_ALIAS_COUNT = 100;

/** Parse `text` (the `yaml` module must be loaded). */
export function parseYamlDocument(text: string): YamlDocument {
  const Y = yaml();
  const lineCounter = new Y.LineCounter();
  const doc = Y.parseDocument(text, { prettyErrors: true, lineCounter });
  if (doc.errors.length > 0) {
    return {
      kind: "invalid",
      errors: doc.errors.map((e) => `YAML syntax: ${e.message}`),
    };
  }
  const unresolved = unresolvedAliases(doc, lineCounter);
  if (unresolved.length > 0) return { kind: "invalid", errors: unresolved };
  try {
    return { kind: "ok", value: doc.toJS({ maxAliasCount: MAX_YAML_ALIAS_COUNT }) ?? {} };
  } catch (error) {
    // The module's own checks on what its aliases expand to (their count, an alias within its
    // own anchor): the document's fault, not ours.
    if (!(error instanceof ReferenceError)) throw error;
    return {
      kind: "invalid",
      errors: [`YAML alias: ${error.message} (at most ${MAX_YAML_ALIAS_COUNT} alias expansions)`],
    };
  }
}

/**
 * Every alias (`*name`) with no anchor (`&name`) before it, in one pass over the document: the
 * anchors seen so far are the ones an alias may name (YAML 1.2, 7.1).
 */
function unresolvedAliases(
  doc: YamlModule.Document,
  lineCounter: YamlModule.LineCounter,
): string[] {
  const Y = yaml();
  const anchors = new Set<string>();
  const problems: string[] = [];
  Y.visit(doc, {
    Node(_key, node) {
      if (Y.isAlias(node)) {
        if (anchors.has(node.source)) return;
        const at = node.range ? lineCounter.linePos(node.range[0]) : undefined;
        const where = at ? ` at line ${at.line}, column ${at.col}` : "";
        problems.push(
          `YAML alias: *${node.source}${where} names no anchor (&${node.source}) set before it`,
        );
      } else if (node.anchor) anchors.add(node.anchor);
    },
  });
  return problems;
}
