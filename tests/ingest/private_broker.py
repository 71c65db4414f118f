"""A throwaway single-node Kafka (KRaft) broker for tests that must stop and restart the broker.

The shared broker of the local stack cannot be stopped under other engineers' tests, so this starts a
second one from the same jars (``deploy/local/kafka.sh`` resolves them into the prewarm cache) on free
ports, with its own log directory under the test's tmp_path.
"""

from __future__ import annotations

import base64
import os
import signal
import socket
import subprocess
from pathlib import Path

from kafka import KafkaAdminClient
from wait_helpers import wait_for

REPO = Path(__file__).resolve().parents[2]


def kafka_lib_dir() -> Path | None:
    cache = Path(os.environ.get("STACK_CACHE_DIR") or Path.home() / ".cache" / "prewarm")
    for lib in sorted(cache.glob("kafka-lib-*")):
        if (lib / ".complete").exists():
            return lib
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrivateBroker:
    def __init__(self, root: Path, lib: Path) -> None:
        self.root = root
        self.lib = lib
        self.port = _free_port()
        self.controller_port = _free_port()
        self.props = root / "server.properties"
        self.log = root / "broker.log"
        self.proc: subprocess.Popen[bytes] | None = None
        (root / "data").mkdir(parents=True, exist_ok=True)
        self.props.write_text(
            "\n".join(
                [
                    "process.roles=broker,controller",
                    "node.id=1",
                    f"controller.quorum.voters=1@127.0.0.1:{self.controller_port}",
                    f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
                    f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
                    "controller.listener.names=CONTROLLER",
                    "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
                    "inter.broker.listener.name=PLAINTEXT",
                    f"log.dirs={root / 'data'}",
                    "offsets.topic.replication.factor=1",
                    "transaction.state.log.replication.factor=1",
                    "transaction.state.log.min.isr=1",
                    "group.initial.rebalance.delay.ms=0",
                    "offsets.topic.num.partitions=1",
                    "auto.create.topics.enable=true",
                    "num.partitions=1",
                    "log.cleaner.enable=false",
                ]
            )
            + "\n"
        )
        cluster = base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")
        while cluster.startswith("-"):
            cluster = base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")
        subprocess.run(
            [*self._jvm(), "kafka.tools.StorageTool", "format", "-t", cluster, "-c", str(self.props)],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=120,
        )

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _jvm(self) -> list[str]:
        log4j = REPO / "deploy" / "local" / "kafka" / "log4j.properties"
        return [
            "java",
            "-Xms256m",
            "-Xmx256m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-Djava.awt.headless=true",
            f"-Dlog4j.configuration=file:{log4j}",
            f"-Dkafka.logs.dir={self.root}",
            "-cp",
            f"{self.lib}/*",
        ]

    def start(self, timeout_s: float = 120.0) -> None:
        handle = self.log.open("ab")
        self.proc = subprocess.Popen(
            [*self._jvm(), "kafka.Kafka", str(self.props)], stdout=handle, stderr=subprocess.STDOUT
        )
        proc = self.proc

        def ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"private broker exited with {proc.returncode}; see {self.log}")
            return self._ready()

        wait_for(ready, timeout_s, f"the private broker to be ready (see {self.log})", interval=0.5)

    def _ready(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                pass
            admin = KafkaAdminClient(
                bootstrap_servers=self.bootstrap, request_timeout_ms=3000, api_version_auto_timeout_ms=3000
            )
            try:
                return bool(admin.describe_cluster()["brokers"])
            finally:
                admin.close()
        except Exception:
            return False

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None
