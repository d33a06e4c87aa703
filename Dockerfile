# The sandbox image: a non-root user, a workspace, the exec wrapper, the worker and the relay
# (which carries the host proxies' connections over the exec stream), layered on any
# Debian-like base. The tool builds it on demand and tags it by the hash of its inputs.
ARG BASE_IMAGE=sandbox-base:bookworm
FROM ${BASE_IMAGE}

# uid 10001 rarely clashes with users a base image already has (node's 1000, for one). A
# devcontainer's image already has it: its own user, mapped to 10001, is the sandbox user there.
RUN if ! getent passwd 10001 >/dev/null; then \
      groupadd --gid 10001 sandbox \
      && useradd --uid 10001 --gid 10001 --home-dir /home/sandbox --shell /bin/bash --no-create-home sandbox; \
    fi \
 && mkdir -p /workspace /home/sandbox \
 && chown 10001:10001 /workspace /home/sandbox \
 && chmod 0700 /home/sandbox

# The wrappers' interpreter: perl, but executable only (0711). The kernel makes a process whose
# interpreter its user may not read undumpable from the exec on, so no process of the sandbox user
# can read a starting wrapper's environment or ptrace it, nor can a sweep
# mistake it for a leftover, in the milliseconds before the wrapper says so itself (prctl).
RUN install -D -o root -g root -m 0711 "$(readlink -f /usr/bin/perl)" /usr/local/libexec/sandbox-perl
# The programs come with their mode (0755) set in the build context (lib/sandbox/image.ts): a
# `RUN chmod` after the COPY would store the 96 MB deno binary a second time, in its own layer.
COPY sandbox-exec sandbox-attach deno /usr/local/bin/
COPY worker.js relay.js /opt/sandbox/
RUN mkdir -p /opt/sandbox/deno-dir && chown 10001:10001 /opt/sandbox/deno-dir

ENV HOME=/home/sandbox \
    LANG=C.UTF-8 \
    IS_SANDBOX=1 \
    DENO_DIR=/tmp/deno-dir \
    DENO_NO_UPDATE_CHECK=1 \
    NO_COLOR=1
WORKDIR /workspace
USER 10001:10001
# Warm Deno's caches for the worker as the user who runs it, at the path it runs from, so that a
# run does not pay a cold start. Deno uses its cache only where it can write, and the root
# filesystem is read-only at run time: the container's first act is to copy it to /tmp.
# Then each cache database is checkpointed and compacted (its write-ahead log, 4 of its 6.5 MB, is
# folded in): every Deno program of the tool copies the whole directory when it starts.
RUN DENO_DIR=/opt/sandbox/deno-dir deno run --allow-all --no-config /opt/sandbox/worker.js --help >/dev/null \
 && DENO_DIR=/opt/sandbox/deno-dir deno run --quiet --no-config --no-prompt --allow-net=127.0.0.1 /opt/sandbox/relay.js --check \
 && DENO_DIR=/tmp/compact-deno-dir deno eval --no-config 'import { DatabaseSync } from "node:sqlite"; \
      for (const name of ["v8_code_cache_v2", "dep_analysis_cache_v2", "node_analysis_cache_v2"]) { \
        const db = new DatabaseSync(`/opt/sandbox/deno-dir/${name}`); \
        db.exec("PRAGMA wal_checkpoint(TRUNCATE); PRAGMA journal_mode=DELETE; VACUUM;"); db.close(); }' \
 && rm -rf /tmp/compact-deno-dir /opt/sandbox/deno-dir/*-wal /opt/sandbox/deno-dir/*-shm
# Under the exec wrapper like every command: it starts only if the container can still start one.
HEALTHCHECK --interval=30s --timeout=5s --start-period=2s --retries=3 CMD ["sandbox-exec", "health", "test", "-w", "/workspace"]
# pid 1 is the wrapper in init mode (see scripts/sandbox-exec): it copies the cache to /tmp,
# then reaps orphans; nothing in the sandbox can ptrace it.
CMD ["sandbox-exec", "--init"]
