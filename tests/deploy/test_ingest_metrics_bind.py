"""`prewarm ingest run` serves /metrics on ingest_metrics_host: the chart binds it to the pod's address so
Prometheus (and the liveness probe) can reach it; the default stays loopback."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

# Another loopback address than 127.0.0.1: answering there, and not on 127.0.0.1, shows the setting is
# the address the server binds.
HOST = "127.0.0.2"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def test_ingest_metrics_server_listens_on_the_configured_host(
    kafka_bootstrap: str, unique: str, tmp_path: Path
) -> None:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREWARM_")}
    env.update(
        PREWARM_KAFKA_BOOTSTRAP=kafka_bootstrap,
        PREWARM_DATABASE_URL=f"sqlite:///{tmp_path / 'demand.db'}",
        PREWARM_DATA_DIR=str(tmp_path),
        PREWARM_TOPIC_REQUESTS=f"requests-{unique}",
        PREWARM_TOPIC_DLQ=f"dlq-{unique}",
        PREWARM_CONSUMER_GROUP=f"ingest-{unique}",
        PREWARM_INGEST_METRICS_HOST=HOST,
        PREWARM_INGEST_METRICS_PORT=str(port),
    )
    prewarm = Path(sys.executable).parent / "prewarm"
    process = subprocess.Popen(
        [str(prewarm), "ingest", "run", "--idle-exit", "60"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        body = ""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and process.poll() is None:
            try:
                with urllib.request.urlopen(f"http://{HOST}:{port}/healthz", timeout=2) as response:
                    body = response.read().decode()
                    break
            except OSError:
                time.sleep(0.3)
        assert "prewarm_ingest" in body, process.stderr.read() if process.poll() is not None else "no answer"
        with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), timeout=2):
            pass
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
