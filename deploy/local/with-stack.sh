#!/usr/bin/env bash
# with-stack.sh CMD [ARG...]: run CMD against the local stack (this is what `make test` uses).
# Starts whatever is not running, sources .stack/env, runs CMD, and afterwards stops only the services
# this invocation started, so a stack someone is already using survives a test run. Exits with CMD's
# exit code.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=deploy/local/lib.sh source-path=SCRIPTDIR
source "$here/lib.sh"

(($# > 0)) || die "usage: with-stack.sh CMD [ARG...]"

# `stack.sh up` appends each service it launches to this file (see launch in lib.sh).
started_file=$(mktemp "${TMPDIR:-/tmp}/prewarm-stack-started.XXXXXX")

# shellcheck disable=SC2317  # runs from the EXIT trap
stop_ours() {
  local rc=$?
  trap - EXIT INT TERM
  local -a ours=()
  mapfile -t ours <"$started_file"
  rm -f "$started_file"
  if ((${#ours[@]} > 0)); then
    bash "$here/stack.sh" down "${ours[@]}" || log "warning: stopping ${ours[*]} failed"
  fi
  exit "$rc"
}
# Set before `up`, so that a failed or interrupted `up` still stops what it managed to start (a signal
# becomes a normal exit, which runs the EXIT trap).
trap stop_ours EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The status lines go to stderr: CMD's stdout stays its own.
STACK_STARTED_FILE=$started_file bash "$here/stack.sh" up >&2
# shellcheck disable=SC1091
source "$STACK_DIR/env"

# CMD runs in the background and we `wait` for it, because bash defers a trap until a foreground command
# ends: a TERM (a CI time-out) must reach CMD now and then stop the stack, not after the whole test run.
# <&0 keeps CMD's stdin (a background job would get /dev/null); env --default-signal undoes the SIGINT
# ignore that bash gives background jobs, so Ctrl-C still interrupts CMD.
set +e
env --default-signal=INT,QUIT "$@" <&0 &
child=$!
trap 'kill -TERM "$child" 2>/dev/null' TERM
# Ctrl-C in a terminal reaches CMD directly (same process group); forwarding it would interrupt CMD twice.
trap ':' INT
while :; do
  wait "$child"
  rc=$?
  # A trapped signal interrupts `wait` while CMD still runs: keep waiting for its real exit status.
  kill -0 "$child" 2>/dev/null || break
done
exit "$rc"
