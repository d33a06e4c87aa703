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
  if (!loaded) throw new Error("Internal error: the yaml module is used before loadYaml() finished");
  return loaded;
}

/** A YAML document as plain data, or its syntax errors (as configuration issues' messages). */
export type YamlDocument = { kind: "ok"; value: unknown } | { kind: "invalid"; errors: string[] };

/** Parse `text` (the `yaml` module must be loaded). */
export function parseYamlDocument(text: string): YamlDocument {
  const doc = yaml().parseDocument(text, { prettyErrors: true });
  if (doc.errors.length > 0) return { kind: "invalid", errors: doc.errors.map((e) => e.message) };
  return { kind: "ok", value: doc.toJS() ?? {} };
}
