# shellcheck shell=bash disable=SC2034  # the settings here are used by the scripts that source this file
# Sourced by stack.sh, with-stack.sh and the per-service scripts: paths, ports, logging, and the
# launch / stop / readiness machinery that every service of the local stack shares.
# Not executable on its own.

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
LOCAL="$REPO/deploy/local"
STACK_DIR=${STACK_DIR:-$REPO/.stack}
LOG_DIR="$STACK_DIR/logs"
PID_DIR="$STACK_DIR/pids"
# Downloads and builds live outside the repo so that a fresh clone (CI clones into a new folder) reuses
# them; ~/.m2 and Go's module cache hold the raw downloads anyway.
CACHE_DIR=${STACK_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/prewarm}
PY="$REPO/.venv/bin/python"

HOST=127.0.0.1
# Non-default ports, so the stack never collides with a system PostgreSQL, a developer's Kafka, etc.,
# and below Linux's ephemeral range (32768-60999 by default), where any outgoing connection may hold
# one for a while: a service bound there found its port taken by a client now and then.
# STACK_ rather than PREWARM_: the prewarm settings loader rejects unknown PREWARM_* variables.
KAFKA_PORT=${STACK_KAFKA_PORT:-27092}
KAFKA_CONTROLLER_PORT=${STACK_KAFKA_CONTROLLER_PORT:-27093}
S3_PORT=${STACK_S3_PORT:-27900}
PG_PORT=${STACK_PG_PORT:-25432}
MLFLOW_PORT=${STACK_MLFLOW_PORT:-25000}

S3_ACCESS_KEY=${STACK_S3_ACCESS_KEY:-prewarm}
S3_SECRET_KEY=${STACK_S3_SECRET_KEY:-prewarmsecret}
S3_REGION=us-east-1
S3_TEST_BUCKET=prewarm-test
S3_MLFLOW_BUCKET=prewarm-mlflow
# What every S3 client of this stack is given: the keys, and checksums only where the API requires them
# (recent boto3 otherwise sends trailers that S3-compatible servers may reject).
S3_CLIENT_ENV=(
  AWS_ACCESS_KEY_ID="$S3_ACCESS_KEY" AWS_SECRET_ACCESS_KEY="$S3_SECRET_KEY" AWS_DEFAULT_REGION="$S3_REGION"
  AWS_REQUEST_CHECKSUM_CALCULATION=when_required AWS_RESPONSE_CHECKSUM_VALIDATION=when_required
)
PG_USER=prewarm

log() { printf 'stack: %s\n' "$*" >&2; }
die() {
  log "error: $*"
  exit 1
}

# Name the service and show the end of its log (of its latest start only: older runs would only mislead):
# a start-up failure must be diagnosable from the terminal, or CI's output, alone.
report_failure() {
  local svc=$1
  shift
  log "error: $svc: $*"
  local file="$LOG_DIR/$svc.log"
  if [[ -s $file ]]; then
    printf -- '----- last 30 lines of %s -----\n' "$file" >&2
    awk '/^===== .*: starting / { n = 0 } { line[n++] = $0 }
      END { for (i = (n > 30 ? n - 30 : 0); i < n; i++) print line[i] }' "$file" >&2
    printf -- '-----\n' >&2
  fi
}

fail_service() {
  report_failure "$@"
  exit 1
}

# A TCP connect through bash itself: no nc/ss needed on a fresh machine.
port_open() { (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null; }

# Start time of a process in clock ticks since boot (field 22 of /proc/PID/stat). Together with the pid
# it identifies one process for good: a recycled pid has another start time.
proc_starttime() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  # Field 2 (the command name) may contain spaces and parentheses; everything after the last ") " is
  # plain, starting at field 3.
  stat=${stat##*) }
  local -a fields
  read -r -a fields <<<"$stat"
  echo "${fields[19]}"
}

# Print the pid of SERVICE when its pid file names a live process that this stack started: same pid, same
# start time, and the command line still contains the marker recorded at launch. Anything else (no file,
# a dead or zombie process, a recycled pid) counts as not running.
running_pid() {
  local file="$PID_DIR/$1.pid" pid start marker
  [[ -r $file ]] || return 1
  read -r pid start marker <"$file" || return 1
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  [[ "$(proc_starttime "$pid" 2>/dev/null)" == "$start" ]] || return 1
  tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -qF -- "$marker" || return 1
  echo "$pid"
}

# Ready means: running, and its readiness check plus set-up (buckets, databases) passed after the last
# launch. `up` skips such a service entirely, which is what keeps a second `up` fast.
is_ready() { running_pid "$1" >/dev/null && [[ -e "$PID_DIR/$1.ready" ]]; }
mark_ready() { touch "$PID_DIR/$1.ready"; }

# launch SERVICE MARKER CMD...: start CMD in the background, detached, logging to .stack/logs/SERVICE.log.
# MARKER is a string of CMD's command line that `down` checks before it signals anything.
launch() {
  local svc=$1 marker=$2
  shift 2
  mkdir -p "$LOG_DIR" "$PID_DIR"
  rm -f "$PID_DIR/$svc.ready"
  # Logs are appended across restarts; past 20 MB (the S3 server logs every request) keep one old
  # generation instead.
  local logfile="$LOG_DIR/$svc.log"
  if [[ -f $logfile ]] && (($(stat -c %s "$logfile") > 20 * 1024 * 1024)); then
    mv -f "$logfile" "$logfile.1"
  fi
  printf '===== %s: starting %s =====\n' "$(date -u +%FT%TZ)" "$svc" >>"$logfile"
  # setsid: its own session and process group, so `down` can stop worker children with it and a Ctrl-C
  # in the caller's terminal does not reach it. 9>&-: the stack lock must not outlive this script.
  # (A background job of a non-interactive shell is no group leader, so setsid execs without forking
  # and $! is the service's own pid.)
  setsid "$@" </dev/null >>"$logfile" 2>&1 9>&- &
  local pid=$!
  local start
  start=$(proc_starttime "$pid") || fail_service "$svc" "exited immediately"
  echo "$pid $start $marker" >"$PID_DIR/$svc.pid"
  # with-stack.sh stops exactly what its own `up` launched; recorded here, under the stack lock, so a
  # concurrent invocation or a failed `up` cannot make it stop too much or too little.
  if [[ -n ${STACK_STARTED_FILE:-} ]]; then echo "$svc" >>"$STACK_STARTED_FILE"; fi
}

# True while any process of the group PGID is alive (zombies do not count: if nothing reaps them they
# would otherwise look alive forever).
group_alive() {
  ps -e -o pgid=,stat= 2>/dev/null | awk -v g="$1" '$1 == g && $2 !~ /^Z/ { found = 1 } END { exit !found }'
}

# stop_service SERVICE [SIGNAL] [TIMEOUT] [group|leader]: send SIGNAL (to the whole process group, or only
# to the leader for servers that shut their children down themselves), wait up to TIMEOUT seconds for
# the group to be gone, then SIGKILL what is left of it.
stop_service() {
  local svc=$1 sig=${2:-TERM} timeout=${3:-20} target=${4:-group} pid
  if ! pid=$(running_pid "$svc"); then
    rm -f "$PID_DIR/$svc.pid" "$PID_DIR/$svc.ready"
    return 0
  fi
  log "stopping $svc (pid $pid)"
  if [[ $target == group ]]; then
    kill -s "$sig" -- "-$pid" 2>/dev/null || true
  else
    kill -s "$sig" "$pid" 2>/dev/null || true
  fi
  local deadline=$((SECONDS + timeout))
  while group_alive "$pid" && ((SECONDS < deadline)); do
    sleep 0.2
  done
  if group_alive "$pid"; then
    log "$svc did not stop within ${timeout}s; sending SIGKILL"
    kill -KILL -- "-$pid" 2>/dev/null || true
  fi
  rm -f "$PID_DIR/$svc.pid" "$PID_DIR/$svc.ready"
}

# wait_ready SERVICE TIMEOUT CHECK...: poll CHECK until it succeeds. Fails fast, with the log, when the
# process dies during start-up; otherwise after TIMEOUT seconds, showing the last check's output.
wait_ready() {
  local svc=$1 timeout=$2
  shift 2
  local deadline=$((SECONDS + timeout)) out=""
  until out=$("$@" 2>&1); do
    running_pid "$svc" >/dev/null || fail_service "$svc" "exited during start-up${out:+ (last check: ${out##*$'\n'})}"
    if ((SECONDS >= deadline)); then
      report_failure "$svc" "not ready after ${timeout}s${out:+ (last check: ${out##*$'\n'})}"
      # A server stuck half-way would make every later `up` wait for it again: stop it.
      "${svc}_stop"
      exit 1
    fi
    sleep 0.5
  done
}

# Refuse to start a service whose port something else already holds: it would fail later with a less
# obvious error, or worse, the readiness check would pass against the stranger.
require_free_port() {
  local svc=$1 port=$2
  if port_open "$port"; then
    die "$svc: port $HOST:$port is already in use by a process this stack did not start" \
      "(stop it, or choose another port with the STACK_*_PORT variables)"
  fi
}

need_root_for() {
  [[ $EUID -eq 0 ]] || die "$1 is missing and installing it needs root (run as root, or install it yourself)"
}

# `apt-get update` once per stack.sh run, only when something actually has to be installed.
APT_UPDATED=0
apt_install() {
  need_root_for "$*"
  if ((APT_UPDATED == 0)); then
    log "apt-get update"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    APT_UPDATED=1
  fi
  log "apt-get install $*"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >&2
}

require_venv() {
  [[ -x $PY ]] || die "$PY is missing: run \`make env\` first"
}
