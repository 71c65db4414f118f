"""The hint API against its own OpenAPI document: schemathesis, over a real socket, on the real server.

Every operation of the document gets generated requests, valid and invalid, plus schemathesis' coverage
cases (each constraint at its edge, missing or wrong tokens, methods the path does not document). The
built-in checks hold the server to the document: no 5xx, only documented statuses, content types,
headers and bodies, auth enforced where declared, valid input accepted and invalid refused, a 405 with
an ``Allow`` that names every documented method. One check of our own: no response holds a token.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import httpx
import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, settings
from scheduler_builders import GB, catalog, cluster, spec

from prewarm import SchedulerSettings
from scheduler import PlannerConfig
from scheduler._api import create_app
from scheduler._core import SchedulerCore
from scheduler._serve import BackgroundServer

# Random per run, so that nothing in a generated request or a canned reply can match one by chance.
WRITER = f"wr-{secrets.token_hex(12)}"
PUBLISHABLE = f"pk-{secrets.token_hex(12)}"
READER = f"rd-{secrets.token_hex(12)}"
TOKENS = (WRITER, PUBLISHABLE, READER)


def _app() -> FastAPI:
    api = SchedulerSettings.model_validate(
        {
            "hint_tokens": f"shop:{WRITER}",
            "publishable_tokens": f"web:{PUBLISHABLE}:chat",
            "read_tokens": f"dashboard:{READER}",
            # Generous: a 429 is documented and allowed, but would hide what the later requests test.
            "hint_rate_per_s": 1000.0,
            "hint_burst": 1000,
        }
    )
    core = SchedulerCore(
        catalog=catalog(spec("chat", 2 * GB), spec("search", GB), spec("org/llm", GB)),
        cluster=cluster("gpu-a"),
        config=PlannerConfig(),
        dispatch=lambda orders: None,
    )
    return create_app(core, api)


APP = _app()
# Built from the app, not fetched, so that collecting the tests needs no server; the first test below
# shows the server serves this very document.
schema = schemathesis.openapi.from_dict(APP.openapi())


@pytest.fixture(scope="module")
def server() -> Iterator[BackgroundServer]:
    with BackgroundServer(APP) as running:
        yield running


def leaked(text: str) -> list[str]:
    """The kinds of the tokens ``text`` holds (their prefixes, never the tokens themselves)."""
    return [t[:3] for t in TOKENS if t in text]


def no_token_in_response(
    ctx: schemathesis.CheckContext, response: schemathesis.Response, case: schemathesis.Case
) -> None:
    """No configured token appears in a response's body or headers, whatever was asked."""
    seen = response.text + "".join(f"{k}: {v}" for k, v in response.headers.items())
    assert not leaked(seen), f"a response holds a token ({leaked(seen)})"


def test_the_server_serves_the_document_that_is_fuzzed(server: BackgroundServer) -> None:
    served = httpx.get(f"{server.url}/openapi.json", timeout=5)
    assert served.status_code == 200
    assert served.json() == APP.openapi()
    assert not leaked(served.text)


@pytest.mark.slow
@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_the_api_keeps_the_promises_of_its_document(
    case: schemathesis.Case, server: BackgroundServer
) -> None:
    # Each role where it is allowed: schemathesis itself tries each operation without a token and with
    # a wrong one, and expects a 401 or 403.
    token = WRITER if case.method == "POST" else READER
    case.call_and_validate(
        base_url=server.url,
        headers={"Authorization": f"Bearer {token}"},
        additional_checks=[no_token_in_response],
    )
