"""Who may read what, and what the API document says about it: token roles on every route, 405s, errors."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from test_api import READ, bearer, make

from scheduler._serve import BackgroundServer

READS = ["/v1/hints", "/v1/plan", "/v1/models/chat", "/v1/models/org/llm"]
WRITER = bearer("s3cret-shop")
PUBLISHABLE = bearer("pk-web")


@pytest.fixture
def client() -> TestClient:
    c, _, _ = make()
    return c


@pytest.mark.parametrize("path", READS)
def test_a_read_without_a_token_is_401(client: TestClient, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 401
    assert response.json()["error"] == "unauthorized"
    assert response.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize("path", READS)
def test_a_read_with_a_wrong_token_is_403_and_is_not_echoed(client: TestClient, path: str) -> None:
    response = client.get(path, headers=bearer("guess-123"))
    assert response.status_code == 403
    assert "guess-123" not in response.text


@pytest.mark.parametrize("path", READS)
def test_a_publishable_token_cannot_read_the_plan(client: TestClient, path: str) -> None:
    response = client.get(path, headers=PUBLISHABLE)
    assert response.status_code == 403
    assert "publishable" in response.json()["message"]
    assert "pk-web" not in response.text


@pytest.mark.parametrize("headers", [READ, WRITER], ids=["read-token", "hint-writer-token"])
@pytest.mark.parametrize("path", READS)
def test_read_and_hint_writer_tokens_read(client: TestClient, path: str, headers: dict[str, str]) -> None:
    assert client.get(path, headers=headers).status_code == 200


def test_a_read_token_cannot_post_hints() -> None:
    c, sent, _ = make()
    response = c.post("/v1/hints", json={"model": "chat"}, headers=READ)
    assert response.status_code == 403
    assert "read token" in response.json()["message"]
    assert sent == []
    assert c.get("/v1/hints", headers=READ).json()["hints"] == []


def test_health_readiness_metrics_and_the_document_stay_open(client: TestClient) -> None:
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").status_code == 200
    assert client.get("/metrics").status_code == 200
    assert client.get("/openapi.json").status_code == 200
    # Swagger UI and ReDoc would load scripts from a public CDN on the API's origin: off.
    assert client.get("/docs").status_code == 404
    assert client.get("/redoc").status_code == 404


def test_reads_need_a_token_over_a_real_socket() -> None:
    c, _, _ = make()
    with BackgroundServer(c.app) as server, httpx.Client(base_url=server.url, timeout=5) as http:
        assert http.post("/v1/hints", json={"model": "chat"}, headers=WRITER).status_code == 202
        assert http.get("/v1/plan").status_code == 401
        assert http.get("/v1/plan", headers=PUBLISHABLE).status_code == 403
        plan = http.get("/v1/plan", headers=READ)
        assert plan.status_code == 200
        assert [p["model"] for p in plan.json()["placements"]] == ["chat"]


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("DELETE", "/v1/hints", "GET, POST"),
        ("PUT", "/v1/hints", "GET, POST"),
        ("OPTIONS", "/v1/hints", "GET, POST"),
        ("POST", "/v1/plan", "GET"),
        ("DELETE", "/v1/models/org/llm", "GET"),
        ("POST", "/healthz", "GET"),
    ],
)
def test_a_405_allows_every_method_of_the_path(
    client: TestClient, method: str, path: str, allow: str
) -> None:
    response = client.request(method, path, headers=WRITER)
    assert response.status_code == 405
    assert response.headers["allow"] == allow
    assert response.json()["error"] == "method_not_allowed"


@pytest.mark.parametrize(
    ("path", "status", "where"),
    [
        ("/v1/models/a..b", 422, "'..'"),
        ("/v1/models/-lead", 422, "model_id"),
        (f"/v1/models/{'m' * 129}", 422, "128"),
        ("/v1/models/nope", 404, "unknown model 'nope'"),
    ],
)
def test_a_model_id_in_a_path_is_checked_like_one_in_a_body(
    client: TestClient, path: str, status: int, where: str
) -> None:
    response = client.get(path, headers=READ)
    assert response.status_code == status
    assert where in response.json()["message"]


# ---------------------------------------------------------------- the document


def _document(client: TestClient) -> dict[str, Any]:
    body: dict[str, Any] = client.get("/openapi.json").json()
    return body


@pytest.mark.parametrize(
    ("method", "path", "statuses"),
    [
        ("post", "/v1/hints", {"202", "401", "403", "404", "413", "422", "429", "503"}),
        ("get", "/v1/hints", {"200", "401", "403"}),
        ("get", "/v1/plan", {"200", "401", "403"}),
        ("get", "/v1/models/{model_id}", {"200", "401", "403", "404", "422"}),
        ("get", "/readyz", {"200", "503"}),
    ],
)
def test_the_document_declares_every_status_a_route_sends(
    client: TestClient, method: str, path: str, statuses: set[str]
) -> None:
    responses = _document(client)["paths"][path][method]["responses"]
    assert set(responses) == statuses
    for status, response in responses.items():
        body = response["content"]["application/json"]["schema"]
        if int(status) >= 400 and path != "/readyz":
            assert body == {"$ref": "#/components/schemas/ErrorBody"}, status


def test_the_document_declares_the_error_body_headers_and_the_bearer_scheme(client: TestClient) -> None:
    doc = _document(client)
    error = doc["components"]["schemas"]["ErrorBody"]
    assert error["required"] == ["error", "message"]
    assert error["additionalProperties"] is False
    assert doc["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": doc["components"]["securitySchemes"]["bearer"]["description"],
    }
    post = doc["paths"]["/v1/hints"]["post"]
    assert post["responses"]["401"]["headers"]["WWW-Authenticate"]["required"] is True
    assert post["responses"]["429"]["headers"]["Retry-After"]["required"] is True
    assert post["requestBody"]["x-max-body-bytes"] == 16 * 1024
    for path, methods in doc["paths"].items():
        for method, operation in methods.items():
            secured = operation.get("security") == [{"bearer": []}]
            assert secured == (path.startswith("/v1/")), (method, path)


def test_the_document_refuses_the_model_ids_the_server_refuses(client: TestClient) -> None:
    doc = _document(client)
    in_body = doc["paths"]["/v1/hints"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    (in_path,) = doc["paths"]["/v1/models/{model_id}"]["get"]["parameters"]
    for schema in (in_body["properties"]["model"], in_path["schema"]):
        assert schema["minLength"] == 1
        assert schema["maxLength"] == 128
        assert schema["pattern"].startswith("^(?!.*\\.\\.)")
    # The empty id that the document used to allow is refused by the server as it always was.
    empty = client.post("/v1/hints", json={"model": ""}, headers=WRITER)
    assert empty.status_code == 422
