/** `sandbox proxy`: the credential and egress proxies standalone, for orchestrators' own containers. */
import type { Command } from "commander";
import { SandboxError } from "../lib/errors.ts";
import { cliState, collect, note, profileFor, signal, stdout } from "./context.ts";
import { jsonOption, profileOption } from "./options.ts";

export function registerProxyCommand(program: Command): void {
  program.command("proxy")
    .description(
      "serve the credential and egress proxies standalone, for orchestrators that run their own containers",
    )
    .addOption(profileOption()).addOption(jsonOption())
    .option(
      "--listen <addr>",
      "address to listen on (repeatable; never all interfaces)",
      collect,
      [],
    )
    .action(
      async (opts: { profile?: string; json?: boolean; listen: string[] }, command: Command) => {
        const { startHostProxies } = await import("../lib/proxy/session.ts");
        const profile = await profileFor(command, opts.profile);
        const hostnames = opts.listen.length > 0 ? opts.listen : ["127.0.0.1"];
        await using proxies = await startHostProxies(profile, hostnames, { signal }).catch(
          (error) => {
            throw error instanceof TypeError
              ? new SandboxError("usage", `Invalid --listen: ${error.message}`)
              : error;
          },
        );
        const info = {
          profile: profile.name,
          llm_base_url: hostnames.map((h) => proxies.llmUrl(h)),
          egress_proxy_url: hostnames.map((h) => proxies.egressUrl(h)).filter(Boolean),
          token: proxies.token,
          model: proxies.model,
          authentication:
            'send the token as "Authorization: Bearer TOKEN" or "x-api-key: TOKEN"; it dies with this process',
          env: proxies.envFor(hostnames[0]),
        };
        if (opts.json) await stdout.json(info);
        else {
          note(
            `credential proxy: ${
              info.llm_base_url.join(", ")
            } (OpenAI-style; Anthropic clients use it without /v1)`,
          );
          if (info.egress_proxy_url.length) {
            note(`egress proxy: ${info.egress_proxy_url.join(", ")} (set HTTP_PROXY/HTTPS_PROXY)`);
          }
          note(`token: ${info.token}`);
          note(`sandboxes authenticate with the token as their API key; Ctrl-C stops the proxies`);
        }
        // A signal may already have arrived while the proxies started: check before waiting.
        if (!signal.aborted) {
          await new Promise((resolve) => signal.addEventListener("abort", resolve, { once: true }));
        }
        cliState.endedBySignal = true;
      },
    );
}
