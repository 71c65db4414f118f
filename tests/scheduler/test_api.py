"""The hint API over real HTTP: every error code, token roles, CORS, and a hint that plans at once."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from fastapi.testclient import TestClient
from scheduler_builders import GB, catalog, cluster, spec

from prewarm import Order, OrderAction, SchedulerSettings
from scheduler import PlannerConfig
from scheduler._api import create_app
from scheduler._core import SchedulerCore
from scheduler._serve import BackgroundServer

TOKENS = "shop:s3cret-shop,ops:s3cret-ops"
PUBLISHABLE = "web:pk-web:chat|search"
READ_TOKENS = "dashboard:rd-dash"


class Clock:
    def __init__(self) -> None:
        self.t = 1_800_000_000.0

    def __call__(self) -> float:
        return self.t


def make(**overrides: object) -> tuple[TestClient, list[Order], Clock]:
    settings = SchedulerSettings.model_validate(
        {
            "hint_tokens": TOKENS,
            "publishable_tokens": PUBLISHABLE,
            "read_tokens": READ_TOKENS,
            "cors_origins": "https://shop.example",
            **overrides,
        }
    )
    sent: list[Order] = []
    clock = Clock()
    core = SchedulerCore(
        catalog=catalog(spec("chat", 2 * GB), spec("search", GB), spec("other", GB), spec("org/llm", GB)),
        cluster=cluster("gpu-a"),
        config=PlannerConfig(),
        dispatch=sent.extend,
        clock=clock,
    )
    return TestClient(create_app(core, settings, clock=clock)), sent, clock


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


READ = bearer("rd-dash")


@pytest.fixture
def client() -> Iterator[TestClient]:
    c, _, _ = make()
    with c:
        yield c


def test_hint_with_a_valid_token_plans_at_once() -> None:
    c, sent, clock = make()
    response = c.post("/v1/hints", json={"model": "chat", "eta_s": 60}, headers=bearer("s3cret-shop"))
    assert response.status_code == 202, response.text
    body = response.json()
    assert body["hint"]["source"] == "shop"
    assert body["hint"]["received_at"] == clock.t
    assert [o["action"] for o in body["orders"]] == ["prefetch"]
    assert [(o.model, o.action) for o in sent] == [("chat", OrderAction.PREFETCH)]
    assert c.get("/v1/hints", headers=READ).json()["hints"][0]["model"] == "chat"


def test_missing_token_is_401_and_nothing_is_planned() -> None:
    c, sent, _ = make()
    response = c.post("/v1/hints", json={"model": "chat"})
    assert response.status_code == 401
    assert response.json()["error"] == "unauthorized"
    assert response.headers["www-authenticate"] == "Bearer"
    assert sent == []


def test_wrong_token_is_403_and_is_not_echoed(client: TestClient) -> None:
    response = client.post("/v1/hints", json={"model": "chat"}, headers=bearer("guess-123"))
    assert response.status_code == 403
    assert "guess-123" not in response.text
    assert client.get("/v1/hints", headers=READ).json()["hints"] == []


def test_token_of_another_source_is_403(client: TestClient) -> None:
    response = client.post(
        "/v1/hints", json={"model": "chat", "source": "ops"}, headers=bearer("s3cret-shop")
    )
    assert response.status_code == 403


def test_publishable_token_is_limited_to_its_models(client: TestClient) -> None:
    assert client.post("/v1/hints", json={"model": "search"}, headers=bearer("pk-web")).status_code == 202
    denied = client.post("/v1/hints", json={"model": "other"}, headers=bearer("pk-web"))
    assert denied.status_code == 403
    assert "other" in denied.json()["message"]


def test_unknown_model_is_404(client: TestClient) -> None:
    response = client.post("/v1/hints", json={"model": "nope"}, headers=bearer("s3cret-shop"))
    assert response.status_code == 404
    assert response.json() == {"error": "not_found", "message": "unknown model 'nope'"}
    assert client.get("/v1/models/nope", headers=READ).status_code == 404


def test_body_over_the_limit_is_413(client: TestClient) -> None:
    big = {"model": "chat", "pad": "x" * 20_000}
    response = client.post("/v1/hints", json=big, headers=bearer("s3cret-shop"))
    assert response.status_code == 413
    assert response.json()["error"] == "too_large"


@pytest.mark.parametrize(
    ("body", "where"),
    [
        (b"{not json", "not JSON"),
        (b"[1, 2]", "JSON object"),
        (b'{"model": "chat", "eta_s": -1}', "eta_s"),
        (b'{"model": "../etc"}', "model"),
        (b'{"model": "chat", "extra": 1}', "extra"),
        (b'{"model": "chat", "received_at": 1}', "received_at"),
    ],
)
def test_invalid_hint_is_422_with_a_message(client: TestClient, body: bytes, where: str) -> None:
    response = client.post("/v1/hints", content=body, headers=bearer("s3cret-shop"))
    assert response.status_code == 422
    assert where in response.json()["message"]


def test_rate_limit_is_per_source_and_says_when_to_retry() -> None:
    c, _, _ = make(hint_rate_per_s=0.5, hint_burst=2)
    codes = [
        c.post("/v1/hints", json={"model": "chat"}, headers=bearer("s3cret-shop")).status_code
        for _ in range(3)
    ]
    assert codes == [202, 202, 429]
    limited = c.post("/v1/hints", json={"model": "chat"}, headers=bearer("s3cret-shop"))
    assert limited.json()["error"] == "rate_limited"
    assert int(limited.headers["retry-after"]) >= 1
    # Another source has its own bucket.
    assert c.post("/v1/hints", json={"model": "chat"}, headers=bearer("s3cret-ops")).status_code == 202


def test_cors_preflight_allows_configured_origin_only(client: TestClient) -> None:
    ask = {
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type",
    }
    ok = client.options("/v1/hints", headers={"Origin": "https://shop.example", **ask})
    assert ok.headers["access-control-allow-origin"] == "https://shop.example"
    bad = client.options("/v1/hints", headers={"Origin": "https://evil.example", **ask})
    assert "access-control-allow-origin" not in bad.headers


def test_reads_plan_model_health_metrics_and_openapi(client: TestClient) -> None:
    client.post("/v1/hints", json={"model": "chat"}, headers=bearer("s3cret-shop"))
    plan = client.get("/v1/plan", headers=READ).json()
    assert [p["model"] for p in plan["placements"]] == ["chat"]
    assert plan["upcoming"][0]["model"] == "chat"
    model = client.get("/v1/models/chat", headers=READ).json()
    assert model["model"]["id"] == "chat"
    assert model["recent_orders"][0]["action"] == "prefetch"
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").status_code == 200
    assert b"prewarm_scheduler_hints_total" in client.get("/metrics").content
    assert "/v1/hints" in client.get("/openapi.json").json()["paths"]


def test_every_error_code_over_a_real_socket() -> None:
    c, sent, _ = make(hint_rate_per_s=0.01, hint_burst=3)
    with BackgroundServer(c.app) as server, httpx.Client(base_url=server.url, timeout=5) as http:
        good = bearer("s3cret-shop")
        assert http.post("/v1/hints", json={"model": "chat"}).status_code == 401
        assert http.post("/v1/hints", json={"model": "chat"}, headers=bearer("x")).status_code == 403
        assert http.post("/v1/hints", json={"model": "nope"}, headers=good).status_code == 404
        assert http.post("/v1/hints", content=b"{" * 20_000, headers=good).status_code == 413
        assert http.post("/v1/hints", json={"model": "chat", "ttl_s": 0}, headers=good).status_code == 422
        assert http.post("/v1/hints", json={"model": "chat"}, headers=good).status_code == 202
        # The 404 and 422 above spent two of the three tokens of the bucket.
        limited = http.post("/v1/hints", json={"model": "chat"}, headers=good)
        assert limited.status_code == 429
        assert limited.json()["message"]
    assert {o.model for o in sent} == {"chat"}


def test_tokens_are_never_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("DEBUG")
    c, _, _ = make()
    c.post("/v1/hints", json={"model": "chat"}, headers=bearer("s3cret-shop"))
    c.post("/v1/hints", json={"model": "chat"}, headers=bearer("wrong-token"))
    assert "s3cret" not in caplog.text
    assert "wrong-token" not in caplog.text


def test_model_ids_with_an_organisation_work_in_paths(client: TestClient) -> None:
    assert (
        client.post("/v1/hints", json={"model": "org/llm"}, headers=bearer("s3cret-ops")).status_code == 202
    )
    assert client.get("/v1/models/org/llm", headers=READ).json()["hints"][0]["model"] == "org/llm"
