#!/usr/bin/env bash
# with-stack.sh CMD [ARG...]: run CMD against the local stack (this is what `make test` uses).
# Starts whatever is not running, sources .stack/env, runs CMD, and afterwards stops only the services
# this invocation started, so a stack someone is already using survives a test run. Exits with CMD's
# exit code.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=deploy/local/lib.sh
source "$here/lib.sh"

(($# > 0)) || die "usage: with-stack.sh CMD [ARG...]"

# Decided before `up`, so that a failed `up` still stops what it managed to start.
mapfile -t ours < <(bash "$here/stack.sh" not-ready)

stop_ours() {
  local rc=$?
  trap - EXIT INT TERM
  if ((${#ours[@]} > 0)); then
    bash "$here/stack.sh" down "${ours[@]}" || log "warning: stopping ${ours[*]} failed"
  fi
  exit "$rc"
}
trap stop_ours EXIT
# Turn a Ctrl-C or a CI timeout into a normal exit, so the EXIT trap stops the stack.
trap 'exit 130' INT
trap 'exit 143' TERM

bash "$here/stack.sh" up
# shellcheck disable=SC1091
source "$STACK_DIR/env"

set +e
"$@"
rc=$?
set -e
exit "$rc"
