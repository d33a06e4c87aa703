# Run by the scripted agent inside the sandbox, in its worktree of a remote repository:
#   bash _git_push_attack.sh granted|no-push RUN_BRANCH
# It depends only on $SANDBOX_GIT_URL and the session token in the environment. Each attempt
# prints one line, `name=<HTTP status> <body>` (curl) or `name: <git output>`, for the test to read.
set -u
mode="$1"; branch="$2"
U="$SANDBOX_GIT_URL"; T="$SANDBOX_LLM_TOKEN"
Z=0000000000000000000000000000000000000000
# The remote's branches, as its advertisement (through the proxy) tells them; main is the base.
tip() { git -c http.extraHeader="Authorization: Bearer $T" ls-remote "$U" "refs/heads/$1" | cut -f1; }
M=$(tip main); D=$(tip dev)
echo "from the agent" > agent.txt; git add agent.txt; git commit -qm "agent commit"; C=$(git rev-parse HEAD)

# One pkt-line: old new ref [capabilities, after a NUL].
line() {
  local b="$1 $2 $3"
  if [ -n "${4:-}" ]; then printf '%04x%s\000%s\n' $(( ${#b} + ${#4} + 6 )) "$b" "$4"
  else printf '%04x%s\n' $(( ${#b} + 5 )) "$b"; fi
}
# A pack of the objects of $1 that $2 lacks.
pack() { printf '%s\n^%s\n' "$1" "$2" | git pack-objects --stdout --revs -q; }
# POST a hand-made receive-pack request body: name target file [curl args...]
post() {
  local code
  code=$(curl -s --noproxy '*' --path-as-is --max-time 60 -o /tmp/resp -w '%{http_code}' \
    -H "Authorization: Bearer $T" -H 'Content-Type: application/x-git-receive-pack-request' \
    --data-binary @"$3" "${@:4}" "$U$2")
  echo "$1=$code $(head -c 300 /tmp/resp | tr -c '[:print:]' ' ')"
}
# GET: name target
get() {
  local code
  code=$(curl -s --noproxy '*' --path-as-is --max-time 60 -o /tmp/resp -w '%{http_code}' \
    -H "Authorization: Bearer $T" "$U$2")
  echo "$1=$code $(head -c 300 /tmp/resp | tr -c '[:print:]' ' ')"
}
gitp() { timeout 120 git -c http.extraHeader="Authorization: Bearer $T" "$@" 2>&1 | tr '\n' ' '; echo; }

# The attack: main rewritten to the agent's commit, dev deleted, tag v9 created.
{ line "$M" "$C" refs/heads/main report-status; line "$D" "$Z" refs/heads/dev; line "$Z" "$C" refs/tags/v9
  printf 0000; pack "$C" "$M"; } > /tmp/attack.bin
gzip -c /tmp/attack.bin > /tmp/attack.gz
# Its twin: the same kind of hand-made request, creating the run branch only.
{ line "$Z" "$C" "refs/heads/$branch" report-status; printf 0000; pack "$C" "$M"; } > /tmp/own.bin

if [ "$mode" = granted ]; then
  post bypass '/git-receive-pack?service=git-upload-pack' /tmp/attack.bin
  post bypass-via-upload '/git-upload-pack?service=git-receive-pack' /tmp/attack.bin
  post dot-segment '/x/../git-receive-pack' /tmp/attack.bin
  post double-slash '//git-receive-pack' /tmp/attack.bin
  post encoded-slash '/git-receive-pack%2f' /tmp/attack.bin
  post encoded-name '/git%2dreceive-pack' /tmp/attack.bin
  post trailing-slash '/git-receive-pack/' /tmp/attack.bin
  get two-services '/info/refs?service=git-upload-pack&service=git-receive-pack'
  get dumb-http '/info/refs'
  post plain-path '/git-receive-pack' /tmp/attack.bin
  post gzip '/git-receive-pack' /tmp/attack.gz -H 'Content-Encoding: gzip'
  echo "push-tag: $(gitp push "$U" "$C:refs/tags/v10")"
  echo "push-main: $(gitp push "$U" "$C:refs/heads/main")"
  echo "delete-dev: $(gitp push "$U" :refs/heads/dev)"
  post own-branch '/git-receive-pack' /tmp/own.bin
  echo "more" >> agent.txt; git commit -qam "agent second commit"; C2=$(git rev-parse HEAD)
  { line "$C" "$C2" "refs/heads/$branch" report-status; printf 0000; pack "$C2" "$C"; } | gzip -c > /tmp/own2.gz
  post own-branch-gzip '/git-receive-pack' /tmp/own2.gz -H 'Content-Encoding: gzip'
  echo "delete-own: $(gitp push "$U" ":refs/heads/$branch")"
  echo "agent-commits=$C $C2"
else
  echo "push-own: $(gitp push "$U" "HEAD:refs/heads/$branch")"
  post own-branch '/git-receive-pack' /tmp/own.bin
  get advertisement '/info/refs?service=git-receive-pack'
  post bypass '/git-receive-pack?service=git-upload-pack' /tmp/own.bin
  echo "ls-remote: $(gitp ls-remote "$U" refs/heads/main)"
  echo "agent-commits=$C"
fi
