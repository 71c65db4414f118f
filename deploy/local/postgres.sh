# shellcheck shell=bash
# PostgreSQL from Debian's packages, but our own cluster under .stack/pg on our own port: the system
# cluster (if any) is left alone. Sourced by stack.sh (needs lib.sh).

PG_STATE="$STACK_DIR/pg"
PG_DATA="$PG_STATE/data"
PG_TIMEOUT=${STACK_PG_TIMEOUT:-60}
PG_DATABASES=(prewarm mlflow)
PG_OS_USER=postgres

# Newest installed major version, e.g. /usr/lib/postgresql/15/bin.
postgres_bindir() {
  local dir best=""
  for dir in /usr/lib/postgresql/*/bin; do
    [[ -x $dir/postgres ]] || continue
    if [[ -z $best ]] || [[ "$(printf '%s\n%s\n' "$best" "$dir" | sort -V | tail -n 1)" == "$dir" ]]; then
      best=$dir
    fi
  done
  [[ -n $best ]] && echo "$best"
}

postgres_install() {
  postgres_bindir >/dev/null && return 0
  apt_install postgresql
  postgres_bindir >/dev/null || die "postgres: installed the postgresql package but found no /usr/lib/postgresql/*/bin/postgres"
}

# PostgreSQL refuses to run as root. As root we run it as the `postgres` system user (made by the Debian
# package); as anyone else, as ourselves.
postgres_as_user() {
  PG_AS=()
  ((EUID == 0)) || return 0
  if ! id -u "$PG_OS_USER" >/dev/null 2>&1; then
    useradd --system --no-create-home --shell /usr/sbin/nologin "$PG_OS_USER"
  fi
  # setpriv execs (no fork, unlike su/runuser), so the pid we record is the postmaster's own.
  PG_AS=(setpriv "--reuid=$PG_OS_USER" "--regid=$PG_OS_USER" --init-groups)
}

# The data directory must be reachable by the postgres user. A checkout under a private directory (e.g.
# /root/...) is not, so there the cluster lives under /var/lib/prewarm-stack and .stack/pg links to it.
postgres_prepare_dir() {
  mkdir -p "$STACK_DIR"
  if [[ ! -e $PG_STATE ]]; then
    if ((EUID == 0)) && ! "${PG_AS[@]}" test -x "$STACK_DIR"; then
      local alt
      alt="/var/lib/prewarm-stack/$(printf '%s' "$STACK_DIR" | sha256sum | cut -c1-12)/pg"
      log "postgres: $STACK_DIR is not reachable by user $PG_OS_USER; keeping the cluster in $alt"
      mkdir -p "$alt"
      chmod 755 "$(dirname "$alt")" /var/lib/prewarm-stack
      ln -s "$alt" "$PG_STATE"
    else
      mkdir -p "$PG_STATE"
    fi
  fi
  if ((EUID == 0)); then
    chown "$PG_OS_USER:" "$(readlink -f "$PG_STATE")"
  fi
  # The resolved path: the postgres user may not be able to pass through the link's directory.
  PG_DATA="$(readlink -f "$PG_STATE")/data"
}

postgres_start() {
  require_free_port postgres "$PG_PORT"
  local bin
  bin=$(postgres_bindir)
  postgres_as_user
  postgres_prepare_dir
  mkdir -p "$LOG_DIR"
  # The postgres user may not be allowed into the current directory (a checkout under /root), and
  # initdb and postgres complain about that.
  pushd / >/dev/null
  if [[ ! -e $PG_DATA/PG_VERSION ]]; then
    log "postgres: initdb $PG_DATA"
    # Into a temp dir, renamed when complete: a half-written cluster is never mistaken for a good one.
    # Trust auth is fine because the server listens on 127.0.0.1 only; -N skips fsync (throwaway data).
    rm -rf "$PG_DATA.tmp"
    "${PG_AS[@]}" "$bin/initdb" -D "$PG_DATA.tmp" -U "$PG_USER" --auth=trust --no-locale -E UTF8 -N \
      >>"$LOG_DIR/postgres.log" 2>&1 9>&- || fail_service postgres "initdb failed"
    mv "$PG_DATA.tmp" "$PG_DATA"
  fi
  postgres_clear_stale_lock
  log "postgres: starting on $HOST:$PG_PORT"
  # No Unix socket (its default directory may belong to the system cluster, and long repo paths overflow
  # the socket path limit); durability off because this is test data and the disk is shared.
  launch postgres "$PG_DATA" "${PG_AS[@]}" "$bin/postgres" -D "$PG_DATA" -p "$PG_PORT" \
    -c listen_addresses="$HOST" -c unix_socket_directories= \
    -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200
  popd >/dev/null || return
}

# After a crash or a machine restart postmaster.pid may name a pid that now belongs to another process,
# and PostgreSQL then refuses to start. Remove it only when it is not a live postmaster of this cluster.
postgres_clear_stale_lock() {
  local lock="$PG_DATA/postmaster.pid" pid
  [[ -e $lock ]] || return 0
  read -r pid <"$lock" || true
  if [[ $pid =~ ^[0-9]+$ ]] && tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -qF -- "$PG_DATA"; then
    die "postgres: a postmaster (pid $pid) runs on $PG_DATA but was not started by this stack; stop it first"
  fi
  rm -f "$lock"
}

postgres_psql() {
  PGCONNECT_TIMEOUT=5 "$(postgres_bindir)/psql" -X -q -h "$HOST" -p "$PG_PORT" -U "$PG_USER" "$@"
}

postgres_check() {
  "$(postgres_bindir)/pg_isready" -q -h "$HOST" -p "$PG_PORT" -U "$PG_USER" -d postgres
}

postgres_setup() {
  local db
  for db in "${PG_DATABASES[@]}"; do
    if [[ "$(postgres_psql -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = '$db'")" != 1 ]]; then
      postgres_psql -d postgres -c "CREATE DATABASE \"$db\"" >&2 || fail_service postgres "could not create database $db"
    fi
  done
}

postgres_wait() { wait_ready postgres "$PG_TIMEOUT" postgres_check; }
# SIGINT is PostgreSQL's "fast" shutdown: it disconnects clients instead of waiting for them (TERM would
# wait for every test session and MLflow connection to go away). Only the postmaster is signalled; it
# stops its own children.
postgres_stop() { stop_service postgres INT 30 leader; }
postgres_address() { echo "$HOST:$PG_PORT"; }
