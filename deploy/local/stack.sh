#!/usr/bin/env bash
# The local stack for tests and development: Kafka, an S3 server (versitygw), PostgreSQL and MLflow, each
# on 127.0.0.1 on a non-default port, all state under .stack/ in the repo root.
#
#   stack.sh up                  install what is missing, start what is not running, wait until every
#                                service answers, write .stack/env (source it to use the stack)
#   stack.sh down [SERVICE...]   stop what this stack started (every service by default)
#   stack.sh status              one line per service
#
# Services: postgres, s3, kafka, mlflow. Ports: STACK_KAFKA_PORT (27092), STACK_KAFKA_CONTROLLER_PORT
# (27093), STACK_S3_PORT (27900), STACK_PG_PORT (25432), STACK_MLFLOW_PORT (25000). Start-up timeouts in
# seconds: STACK_KAFKA_TIMEOUT, STACK_S3_TIMEOUT, STACK_PG_TIMEOUT, STACK_MLFLOW_TIMEOUT. Installs (Kafka
# jars, the versitygw build) are cached under ~/.cache/prewarm (STACK_CACHE_DIR).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=deploy/local/lib.sh source-path=SCRIPTDIR
source "$here/lib.sh"
for service_script in postgres s3 kafka mlflow; do
  # shellcheck disable=SC1090
  source "$here/$service_script.sh"
done

# Start order. MLflow needs PostgreSQL and S3; `down` goes in reverse so MLflow lets go of both first.
SERVICES=(postgres s3 kafka mlflow)

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
}

# Serialize up/down: several people (and `make test` runs) share one working tree, and two concurrent
# `up`s would both try to start the same services.
take_lock() {
  mkdir -p "$STACK_DIR"
  exec 9>"$STACK_DIR/lock"
  if ! flock -n 9; then
    log "waiting for another stack.sh up/down to finish"
    flock 9
  fi
}

contains() {
  local needle=$1 item
  shift
  for item in "$@"; do [[ $item == "$needle" ]] && return 0; done
  return 1
}

# Wait for one service, run its set-up (buckets, databases), and remember that it is ready.
settle() {
  "${1}_wait"
  "${1}_setup"
  mark_ready "$1"
}

write_env() {
  local tmp="$STACK_DIR/env.tmp.$$"
  # Only PREWARM_* names that prewarm's settings know: its loader rejects unknown ones. Bucket names
  # therefore use STACK_*.
  cat >"$tmp" <<EOF
# Written by deploy/local/stack.sh up; source it to talk to the local stack.
export PREWARM_KAFKA_BOOTSTRAP=$(kafka_address)
export PREWARM_DATABASE_URL=postgresql+psycopg://$PG_USER@$HOST:$PG_PORT/prewarm
export PREWARM_S3_ENDPOINT=$(s3_address)
export STACK_S3_BUCKET=$S3_TEST_BUCKET
export STACK_MLFLOW_BUCKET=$S3_MLFLOW_BUCKET
$(printf 'export %s\n' "${S3_CLIENT_ENV[@]}")
export MLFLOW_TRACKING_URI=$(mlflow_address)
export MLFLOW_S3_ENDPOINT_URL=$(s3_address)
EOF
  mv "$tmp" "$STACK_DIR/env"
}

cmd_up() {
  require_venv
  take_lock
  local started=$SECONDS svc
  local -a todo=()
  for svc in "${SERVICES[@]}"; do
    is_ready "$svc" || todo+=("$svc")
  done
  if ((${#todo[@]} > 0)); then
    for svc in "${todo[@]}"; do
      "${svc}_install"
    done
    # Launch everything that does not depend on another service first and wait afterwards: the JVM, the
    # Go server and PostgreSQL then start side by side. A service that runs but was never marked ready
    # (an interrupted `up`) is not launched again, only waited for.
    for svc in postgres s3 kafka; do
      if contains "$svc" "${todo[@]}" && ! running_pid "$svc" >/dev/null; then
        "${svc}_start"
      fi
    done
    for svc in postgres s3; do
      if contains "$svc" "${todo[@]}"; then settle "$svc"; fi
    done
    if contains mlflow "${todo[@]}"; then
      running_pid mlflow >/dev/null || mlflow_start
    fi
    for svc in kafka mlflow; do
      if contains "$svc" "${todo[@]}"; then settle "$svc"; fi
    done
  fi
  write_env
  cmd_status
  log "up in $((SECONDS - started))s; use it with: source .stack/env"
}

cmd_down() {
  local svc
  local -a chosen=("$@")
  for svc in "${chosen[@]}"; do
    contains "$svc" "${SERVICES[@]}" || die "unknown service '$svc' (known: ${SERVICES[*]})"
  done
  ((${#chosen[@]} > 0)) || chosen=("${SERVICES[@]}")
  take_lock
  local i
  for ((i = ${#SERVICES[@]} - 1; i >= 0; i--)); do
    svc=${SERVICES[i]}
    if contains "$svc" "${chosen[@]}"; then "${svc}_stop"; fi
  done
  # Without any service the variables would only point at dead ports.
  for svc in "${SERVICES[@]}"; do
    running_pid "$svc" >/dev/null && return 0
  done
  rm -f "$STACK_DIR/env"
}

cmd_status() {
  local svc pid state
  for svc in "${SERVICES[@]}"; do
    if pid=$(running_pid "$svc"); then
      state=running
      is_ready "$svc" || state=starting
      printf '%-9s %-9s %-24s pid %s\n' "$svc" "$state" "$("${svc}_address")" "$pid"
    else
      printf '%-9s %-9s %s\n' "$svc" stopped "$("${svc}_address")"
    fi
  done
}

(($# > 0)) || usage
command=$1
shift
case $command in
  up) (($# == 0)) || usage; cmd_up ;;
  down) cmd_down "$@" ;;
  status) cmd_status ;;
  -h | --help | help) usage ;;
  *) usage ;;
esac
