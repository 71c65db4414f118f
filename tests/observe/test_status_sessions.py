"""The status page's sign-in: a read token in, an HttpOnly SameSite=Strict session cookie out; the data
behind it takes that cookie or a bearer read token, and nothing else."""

from __future__ import annotations

import time
from pathlib import Path

from fastapi.testclient import TestClient
from status_builders import MODELS, core, report, settings

from ingest import Cell, DemandStore
from scheduler import create_app
from scheduler._status import COOKIE, StatusSources


def client(sources: StatusSources | None = None) -> TestClient:
    scheduler, _ = core()
    scheduler.observe(report(time.time()))
    return TestClient(create_app(scheduler, settings(), status=sources))


def test_a_read_token_signs_in_with_an_httponly_strict_cookie() -> None:
    http = client()
    answer = http.post("/status/session", data={"token": "rd-dash"}, follow_redirects=False)
    assert answer.status_code == 303
    assert answer.headers["location"] == "/status"
    cookie = answer.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE}=")
    assert "HttpOnly" in cookie
    assert "SameSite=strict" in cookie or "SameSite=Strict" in cookie
    assert "Path=/status" in cookie
    assert "rd-dash" not in cookie  # the cookie is signed, it does not carry the token
    page = http.get("/status")
    assert 'id="models"' in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]


def test_without_a_session_the_page_is_a_sign_in_form_and_the_data_is_refused() -> None:
    http = client()
    page = http.get("/status")
    assert page.status_code == 200
    assert 'action="/status/session"' in page.text
    assert 'id="models"' not in page.text
    assert http.get("/status/data").status_code == 401


def test_a_publishable_token_cannot_sign_in() -> None:
    http = client()
    answer = http.post("/status/session", data={"token": "pk-web"}, follow_redirects=False)
    assert answer.status_code == 403
    assert COOKIE not in answer.headers.get("set-cookie", "")
    assert "pk-web" not in answer.text


def test_a_forged_or_foreign_cookie_is_refused() -> None:
    http = client()
    http.post("/status/session", data={"token": "rd-dash"}, follow_redirects=False)
    good = http.cookies[COOKIE]
    payload, _, mac = good.partition(".")
    other = client()  # same tokens: a replica with the same configuration accepts the cookie
    other.cookies.set(COOKIE, good)
    assert other.get("/status/data").status_code == 200
    forger = client()
    forger.cookies.set(COOKIE, payload + "." + ("0" if mac[0] != "0" else "1") + mac[1:])
    assert forger.get("/status/data").status_code == 401
    rotated = TestClient(create_app(core()[0], settings(read_tokens="dash:rotated")))
    rotated.cookies.set(COOKIE, good)  # rotating the token that signed in ends its sessions
    assert rotated.get("/status/data").status_code == 401


def test_the_data_takes_a_bearer_read_token_too() -> None:
    http = client()
    assert http.get("/status/data", headers={"Authorization": "Bearer rd-dash"}).status_code == 200
    assert http.get("/status/data", headers={"Authorization": "Bearer pk-web"}).status_code == 403


def test_the_data_holds_models_tiers_per_node_and_gpu_and_demand_of_the_last_day(tmp_path: Path) -> None:
    store = DemandStore(f"sqlite:///{tmp_path / 'demand.db'}")
    now = time.time()
    minute = int(now // 60) * 60
    store.add_counts(
        {
            ("chat-7b", minute - 3600): Cell(requests=5),
            ("chat-7b", minute): Cell(requests=3, cold_starts=2, wait_ms=900),
        },
        {"chat-7b": minute * 1000},
    )
    http = client(StatusSources(demand=lambda: store))
    data = http.get("/status/data", headers={"Authorization": "Bearer rd-dash"}).json()
    assert {m["model"] for m in data["models"]} == set(MODELS)
    chat = next(m for m in data["models"] if m["model"] == "chat-7b")
    assert len(chat["demand_24h"]) == 24
    assert sum(chat["demand_24h"]) == 8
    assert chat["demand_24h"][-1] == 3
    assert chat["tiers"] == {"gpu-a": "L1"}
    [node] = data["nodes"]
    assert node["gpus"] == [{"index": 0, "capacity_bytes": 80 * 10**9, "used_bytes": 10**9}]
    l0 = next(t for t in node["tiers"] if t["tier"] == "L0")
    assert [(r["model"], r["gpus"]) for r in l0["resident"]] == [("search-embed", [0])]
    l1 = next(t for t in node["tiers"] if t["tier"] == "L1")
    assert [(r["model"], r["prefetched"]) for r in l1["resident"]] == [("chat-7b", True)]
    assert [(c["model"], c["cold_starts"], c["wait_s"]) for c in data["cold_starts"]] == [("chat-7b", 2, 0.9)]
    store.close()
