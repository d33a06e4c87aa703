/** `sandbox config validate|show`. */
import type { Command } from "commander";
import { loadYaml } from "../lib/yaml.ts";
import {
  type Config,
  loadConfigOrThrow,
  parseConfig,
  profileNames,
  resolveProfile,
} from "../lib/config.ts";
import { BUILTIN_PROVIDERS } from "../lib/proxy/llm_providers.ts";
import { configFor, stdout } from "./context.ts";
import { jsonOption } from "./options.ts";

export function registerConfigCommands(program: Command): void {
  const config = program.command("config").description("check and print the configuration");
  config.command("validate")
    .description("check a configuration file (default: the one sandbox would use)")
    .argument("[file]", "file to check")
    .addOption(jsonOption())
    .action(async (file: string | undefined, opts: { json?: boolean }, command: Command) => {
      const { config, file: path } = file
        ? await loadConfigOrThrow({ explicit: file })
        : await configFor(command);
      if (path === undefined) {
        if (opts.json) await stdout.json({ valid: true, file: null, profiles: ["default"] });
        else await stdout.line("no configuration file found; the built-in default profile applies");
        return;
      }
      if (opts.json) await stdout.json({ valid: true, file: path, profiles: profileNames(config) });
      else await stdout.line(`${path} is valid (profiles: ${profileNames(config).join(", ")})`);
    });
  config.command("show")
    .description("print the effective configuration, defaults filled in")
    .addOption(jsonOption())
    .action(async (opts: { json?: boolean }, command: Command) => {
      const YAML = await loadYaml();
      const { config, file } = await configFor(command);
      const effective = effectiveConfig(config);
      if (opts.json) await stdout.json({ file: file ?? null, ...effective });
      else {await stdout.write(
          `# ${file ?? "built-in defaults (no configuration file found)"}\n${
            YAML.stringify(effective)
          }`,
        );}
    });
}

/** The configuration with every profile's defaults filled in, including the implicit one. */
function effectiveConfig(config: Config): Config {
  const defaults = parseConfig("profiles: {default: {}}");
  if (defaults.kind !== "ok") throw new Error("unreachable: built-in defaults are invalid");
  const profiles = { ...defaults.config.profiles, ...config.profiles };
  for (const name of Object.keys(profiles)) {
    const cpus = resolveProfile({ ...config, profiles }, name).resources.cpus;
    const llm = profiles[name].llm;
    // The model a run uses when neither the profile nor --model names one.
    const model = llm.model ??
      (llm.provider === "custom" ? "default" : BUILTIN_PROVIDERS[llm.provider].defaultModel);
    profiles[name] = {
      ...profiles[name],
      llm: { ...llm, model },
      sandbox: {
        ...profiles[name].sandbox,
        resources: { ...profiles[name].sandbox.resources, cpus },
      },
    };
  }
  return { ...config, profiles };
}
