#!/usr/bin/env bash
# The test command: provisions what is missing (Deno, a Docker engine, the base image), then runs
# every test — unit (fakes), integration (real Docker) and end-to-end (the CLI as a user runs it).
# Under CI (CI set), Docker tests fail rather than skip when no engine is reachable.
#   usage: scripts/test.sh [deno test args...]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/provision.sh
# Deno's own once-a-day update check would contact dl.deno.land, through whatever proxy a test sets
# for the CLI it starts; the tests that prove the CLI contacts nothing must not see Deno's.
export DENO_NO_UPDATE_CHECK=1

# House rules the tools check, before any test runs: formatting (deno fmt), lint (deno lint) and
# the length of functions (scripts/long_functions.ts).
if [ "$#" -eq 0 ]; then
  deno fmt --check || { echo "tests: files are not formatted (run: deno fmt)" >&2; exit 1; }
  deno lint || { echo "tests: lint failed (run: deno lint)" >&2; exit 1; }
  # No function over 80 lines in cli.ts, mod.ts, cli/, lib/, worker/, relay/ (tests/ and bench/ are not covered).
  deno run --allow-all scripts/long_functions.ts ||
    { echo "tests: functions over 80 lines (listed above): split them into named steps" >&2; exit 1; }
fi

log="$(mktemp /tmp/sandbox-test.XXXXXX.log)"
# What the tests make is listed in the manifest, and every process they start carries the suite's
# marker: the leftover check below blames exactly those, never another suite on the same engine.
suite="$(mktemp -d /tmp/sandbox-suite.XXXXXX)"
export SANDBOX_TEST_SUITE="${suite##*.}" SANDBOX_TEST_MANIFEST="$suite/made"
trap 'rm -f "$log"; rm -rf "$suite"' EXIT
set +e
NO_COLOR=1 deno test --allow-all --trace-leaks "${@:-tests/}" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
# Nothing of the tests' own may outlive them: containers, volumes, networks of their profiles,
# temporary directories, processes (scripts/leftovers.ts; it reports, and removes nothing).
deno run --allow-all scripts/leftovers.ts || status=1

# deno's summary ("ok | 12 passed (3 steps) | 0 failed") as the plain line CI tools read.
summary="$(grep -E '^(ok|FAILED) \| [0-9]+ passed' "$log" | tail -n 1 || true)"
if [ -n "$summary" ]; then
  passed="$(sed -E 's/.*\| ([0-9]+) passed.*/\1/' <<<"$summary")"
  failed="$(sed -E 's/.*\| ([0-9]+) failed.*/\1/' <<<"$summary")"
  ignored="$(grep -oE '[0-9]+ ignored' <<<"$summary" | cut -d' ' -f1 || true)"
  echo "tests: ${passed} passed, ${failed} failed, ${ignored:-0} skipped"
  if [ "${ignored:-0}" -gt 0 ]; then
    echo "tests: ${ignored} skipped: without a Docker engine the security evidence did not run (CI=true makes them fail instead)" >&2
  fi
elif [ "$status" -eq 0 ]; then
  echo "tests: no test summary found" >&2
  status=1
fi
# The deliberate breaks of tests/mutations.ts: each must make the tests fail (deno task mutate).
# The whole suite has just passed on this tree: that is the mutations' baseline.
if [ "$status" -eq 0 ] && [ "$#" -eq 0 ]; then
  deno run --allow-all scripts/mutate.ts --baseline-passed || status=1
fi
exit "$status"
