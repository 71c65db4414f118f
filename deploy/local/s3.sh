# shellcheck shell=bash
# S3-compatible object store: versitygw (Apache-2.0) over a plain directory. Sourced by stack.sh (needs
# lib.sh). Built from source with `go install` because no prebuilt binary is reachable here.

VERSITYGW_VERSION=v1.7.0
S3_STATE="$STACK_DIR/s3"
S3_TIMEOUT=${STACK_S3_TIMEOUT:-30}

# Keyed by version: `versitygw --version` of a `go install` build only says "git", so the path is the
# version check.
s3_bin() { echo "$CACHE_DIR/versitygw-$VERSITYGW_VERSION/versitygw"; }

s3_install() {
  local bin
  bin=$(s3_bin)
  [[ -x $bin ]] && return 0
  command -v go >/dev/null || apt_install golang-go
  log "s3: building versitygw $VERSITYGW_VERSION with go install (a few minutes on 2 cores, once per machine)"
  local tmp
  tmp="$(dirname "$bin").tmp.$$"
  rm -rf "$tmp"
  mkdir -p "$tmp"
  # CGO off: a static binary that needs no C toolchain; GOFLAGS cleared so a developer's -mod=vendor and
  # the like cannot break a module-mode install. Go's output (a line per module) is shown only on failure.
  mkdir -p "$LOG_DIR"
  if ! (cd "$tmp" && GOFLAGS="" CGO_ENABLED=0 GOBIN="$tmp" \
    go install "github.com/versity/versitygw/cmd/versitygw@$VERSITYGW_VERSION") >"$LOG_DIR/s3-install.log" 2>&1; then
    tail -n 30 "$LOG_DIR/s3-install.log" >&2
    die "s3: go install of versitygw $VERSITYGW_VERSION failed (log: $LOG_DIR/s3-install.log)"
  fi
  rm -rf "$(dirname "$bin")"
  mv "$tmp" "$(dirname "$bin")"
}

s3_start() {
  require_free_port s3 "$S3_PORT"
  # --sidecar keeps object metadata in files of its own, so the filesystem needs no extended attributes.
  mkdir -p "$S3_STATE/data" "$S3_STATE/meta"
  log "s3: starting versitygw on $HOST:$S3_PORT"
  launch s3 "$S3_STATE/data" env ROOT_ACCESS_KEY_ID="$S3_ACCESS_KEY" ROOT_SECRET_ACCESS_KEY="$S3_SECRET_KEY" \
    "$(s3_bin)" --port "$HOST:$S3_PORT" posix --sidecar "$S3_STATE/meta" "$S3_STATE/data"
}

# An authenticated request (a wrong key or a half-started server does not pass), creating any of the
# buckets named that do not exist yet: with none named, the readiness check.
s3_buckets() {
  env "${S3_CLIENT_ENV[@]}" "$PY" - "http://$HOST:$S3_PORT" "$@" <<'EOF'
import sys

import boto3
from botocore.config import Config

s3 = boto3.client(
    "s3", endpoint_url=sys.argv[1], config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1})
)
existing = {b["Name"] for b in s3.list_buckets().get("Buckets", [])}
for bucket in sys.argv[2:]:
    if bucket not in existing:
        s3.create_bucket(Bucket=bucket)
EOF
}

s3_check() { port_open "$S3_PORT" && s3_buckets; }
s3_setup() { s3_buckets "$S3_TEST_BUCKET" "$S3_MLFLOW_BUCKET" || fail_service s3 "could not create the buckets"; }

s3_wait() { wait_ready s3 "$S3_TIMEOUT" s3_check; }
s3_stop() { stop_service s3 TERM 10 group; }
s3_address() { echo "http://$HOST:$S3_PORT"; }
