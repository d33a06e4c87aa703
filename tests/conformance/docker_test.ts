/**
 * The provider contract (_contract.ts) against the Docker implementation (mode container): its
 * lifecycle over the warm pool, in a state directory and under a profile of the test's own
 * (_docker_subject.ts). Everything holds.
 */
import { dockerTest } from "../_helpers.ts";
import { providerContract } from "./_contract.ts";
import { openDockerSubject } from "./_docker_subject.ts";
import { PIDS_YAML } from "./_holds.ts";

providerContract({
  name: "docker",
  isolated: true,
  holds: { pidsLimit: true, noNetwork: true, relay: true, keyAbsent: true },
  testOptions: dockerTest(),
  open: () => openDockerSubject(`{pool: 1, ${PIDS_YAML}}`),
});
