"""Fixtures shared by every test: the real services of the local stack, found through `.stack/env`.

`make test` starts the stack and exports its variables. A test that needs a service asks for its fixture;
when the service cannot be reached the test is skipped on a laptop and fails under ``CI=true``, so a
broken stack can never turn into a green run.
"""

from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path
from urllib.parse import urlparse

import pytest

REPO = Path(__file__).resolve().parents[1]
# Public trace samples committed with the repository (their source and licence: data/README.md).
AZURE_SAMPLES = REPO / "data" / "azure-format-samples"
CLUSTER_SHAPES = REPO / "data" / "clusters"


def _stack_env() -> dict[str, str]:
    """Variables from `.stack/env`, for runs that did not source it (an IDE, a bare pytest)."""
    path = REPO / ".stack" / "env"
    values: dict[str, str] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.startswith("export ") and "=" in line:
                key, _, value = line[len("export ") :].partition("=")
                values[key] = value.strip().strip("'\"")
    return values


_STACK = _stack_env()


def stack_var(name: str) -> str | None:
    return os.environ.get(name) or _STACK.get(name)


def _reachable(host: str, port: int, timeout: float = 2.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _need(service: str, variable: str, address: tuple[str, int] | None) -> None:
    why = None
    if address is None:
        why = f"{service}: {variable} is not set (run `make stack-up`)"
    elif not _reachable(*address):
        why = f"{service}: nothing answers at {address[0]}:{address[1]} ({variable})"
    if why is not None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"required service unavailable under CI: {why}")
        pytest.skip(why)


def _url_address(url: str | None) -> tuple[str, int] | None:
    if not url:
        return None
    parsed = urlparse(url)
    default = {"http": 80, "https": 443, "postgresql": 5432}.get(parsed.scheme.split("+")[0], 0)
    return (parsed.hostname or "127.0.0.1", parsed.port or default)


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    value = stack_var("PREWARM_KAFKA_BOOTSTRAP")
    address = None
    if value:
        host, _, port = value.split(",")[0].rpartition(":")
        address = (host, int(port))
    _need("kafka", "PREWARM_KAFKA_BOOTSTRAP", address)
    assert value is not None
    return value


@pytest.fixture(scope="session")
def postgres_url() -> str:
    value = stack_var("PREWARM_DATABASE_URL")
    _need("postgresql", "PREWARM_DATABASE_URL", _url_address(value))
    assert value is not None
    return value


@pytest.fixture(scope="session")
def s3_endpoint() -> str:
    value = stack_var("PREWARM_S3_ENDPOINT")
    _need("s3", "PREWARM_S3_ENDPOINT", _url_address(value))
    assert value is not None
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
        if stack_var(key):
            os.environ.setdefault(key, stack_var(key) or "")
    os.environ.setdefault("AWS_REQUEST_CHECKSUM_CALCULATION", "when_required")
    os.environ.setdefault("AWS_RESPONSE_CHECKSUM_VALIDATION", "when_required")
    return value


@pytest.fixture(scope="session")
def s3_bucket(s3_endpoint: str) -> str:
    """The bucket the stack creates for tests."""
    return stack_var("STACK_S3_BUCKET") or "prewarm-test"


@pytest.fixture(scope="session")
def mlflow_uri() -> str:
    value = stack_var("MLFLOW_TRACKING_URI")
    _need("mlflow", "MLFLOW_TRACKING_URI", _url_address(value))
    assert value is not None
    return value


@pytest.fixture(scope="session")
def azure_samples() -> Path:
    """The folder of Azure Functions trace samples; a clone without it is broken, so no skip."""
    assert (AZURE_SAMPLES / "invocations.csv").is_file(), f"missing {AZURE_SAMPLES}: see data/README.md"
    return AZURE_SAMPLES


@pytest.fixture
def unique() -> str:
    """A short unique suffix for topics, buckets, keys and consumer groups of one test."""
    return uuid.uuid4().hex[:10]


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No PREWARM_* variables from the stack leak into a settings test."""
    for key in list(os.environ):
        if key.startswith("PREWARM_"):
            monkeypatch.delenv(key)


# Each service's marker follows from the fixture that needs it, so ``-m "not s3"`` and friends select
# exactly the tests that talk to that service (parametrized database fixtures mark their own params).
_SERVICE_OF_FIXTURE = {
    "kafka_bootstrap": "kafka",
    "s3_endpoint": "s3",
    "postgres_url": "postgres",
    "mlflow_uri": "mlflow",
}


def pytest_configure(config: pytest.Config) -> None:
    for service in sorted(set(_SERVICE_OF_FIXTURE.values())):
        config.addinivalue_line("markers", f"{service}: needs the {service} service of the local stack")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for fixture in set(getattr(item, "fixturenames", ())) & _SERVICE_OF_FIXTURE.keys():
            item.add_marker(_SERVICE_OF_FIXTURE[fixture])
