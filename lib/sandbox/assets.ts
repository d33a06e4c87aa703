/**
 * Files the tool ships and needs at run time, embedded at build time so that the bundled CLI
 * runs from an empty directory (raw imports are inlined by `deno bundle` and `deno compile`).
 */
import dockerfile from "../../Dockerfile" with { type: "text" };
import sandboxExec from "../../scripts/sandbox-exec" with { type: "text" };
import buildBaseImage from "../../scripts/build-base-image.sh" with { type: "text" };
import devcontainerPrelude from "../../scripts/devcontainer-prelude.sh" with { type: "text" };

/** The sandbox image's build context: file name → content. */
export const IMAGE_CONTEXT: Readonly<Record<string, string>> = {
  "Dockerfile": dockerfile,
  "sandbox-exec": sandboxExec,
};

/** scripts/build-base-image.sh: builds the base image from Debian packages. */
export const BUILD_BASE_IMAGE_SCRIPT: string = buildBaseImage;

/** scripts/devcontainer-prelude.sh: readies a devcontainer's image for the sandbox layer. */
export const DEVCONTAINER_PRELUDE_SCRIPT: string = devcontainerPrelude;
