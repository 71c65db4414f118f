# shellcheck shell=bash
# MLflow tracking server from .venv: runs and the model registry in PostgreSQL, artifacts in the S3
# server's prewarm-mlflow bucket, proxied so that clients need only MLFLOW_TRACKING_URI. Sourced by
# stack.sh (needs lib.sh, and PostgreSQL and S3 up first).

# The first start against an empty database runs every schema migration: slow on 2 shared cores.
MLFLOW_TIMEOUT=${STACK_MLFLOW_TIMEOUT:-240}
MLFLOW_BIN="$REPO/.venv/bin/mlflow"

mlflow_install() {
  [[ -x $MLFLOW_BIN ]] || die "mlflow: $MLFLOW_BIN is missing: run \`make env\` first"
  command -v curl >/dev/null || apt_install curl
}

mlflow_start() {
  require_free_port mlflow "$MLFLOW_PORT"
  log "mlflow: starting on $HOST:$MLFLOW_PORT"
  # One worker: two shared cores, and a test suite is the only client. Allowed hosts list the address we
  # serve on, so the DNS-rebinding guard of MLflow 3 accepts our own clients whatever its defaults.
  # Job execution (GenAI scorers, prompt optimisation) would add a runner and seven huey workers, ~600 MB
  # that tracking and the registry never use. The marker is the repo's mlflow path, which tells our server from any other on this machine.
  launch mlflow "$MLFLOW_BIN server" env \
    MLFLOW_S3_ENDPOINT_URL="http://$HOST:$S3_PORT" "${S3_CLIENT_ENV[@]}" \
    MLFLOW_DISABLE_TELEMETRY=true DO_NOT_TRACK=true MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false \
    "$MLFLOW_BIN" server --host "$HOST" --port "$MLFLOW_PORT" --workers 1 \
    --backend-store-uri "postgresql+psycopg://$PG_USER@$HOST:$PG_PORT/mlflow" \
    --artifacts-destination "s3://$S3_MLFLOW_BUCKET/artifacts" \
    --allowed-hosts "$HOST,$HOST:$MLFLOW_PORT,localhost,localhost:$MLFLOW_PORT"
}

mlflow_check() {
  [[ "$(curl -fsS --max-time 5 "http://$HOST:$MLFLOW_PORT/health" 2>&1)" == OK ]]
}

mlflow_wait() { wait_ready mlflow "$MLFLOW_TIMEOUT" mlflow_check; }
mlflow_setup() { :; }
# The CLI process only supervises uvicorn, which runs as its child: signal the whole group.
mlflow_stop() { stop_service mlflow TERM 20 group; }
mlflow_address() { echo "http://$HOST:$MLFLOW_PORT"; }
