/** What the Kubernetes tests share: the sandbox image their pods run, built when missing. */
import { ensureImage } from "../lib/sandbox/image.ts";
import { DockerCli } from "../lib/sandbox/docker.ts";
import { DEFAULT_BASE_IMAGE } from "../lib/config.ts";

let built: Promise<string> | undefined;

/** The tag of the sandbox image (the pods' image), built once per test process if missing. */
export function ensureSandboxImage(): Promise<string> {
  built ??= ensureImage(new DockerCli(), DEFAULT_BASE_IMAGE).then((info) => info.tag);
  return built;
}
