"""The status page in headless Chromium, against a running scheduler (the live runtime on the local
stack's Kafka, its hint API served over real HTTP): sign in with a read token, see the scheduler's models
and a node's tiers, and watch the page update, without a reload, after a hint."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from metrics_helpers import sample
from observe_helpers import need_tool
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait
from stack_settings import settings_for_stack
from status_builders import GB, MODELS, READER, WRITER, report

from models import Catalog, ModelSpec
from scheduler import Cluster, PlannerConfig, create_app
from scheduler._runtime import Runtime
from scheduler._serve import BackgroundServer

pytestmark = pytest.mark.slow


@pytest.fixture
def server(kafka_bootstrap: str, unique: str, tmp_path: Path) -> Iterator[tuple[str, Runtime]]:
    settings = settings_for_stack(kafka_bootstrap, unique, tmp_path, hint_tokens=WRITER, read_tokens=READER)
    catalog = Catalog(
        [ModelSpec(id=m, version="1", uri=f"file:///w/{m.replace('/', '_')}", size_bytes=GB) for m in MODELS]
    )
    cluster = Cluster.from_data(
        {
            "nodes": [
                {
                    "name": "gpu-a",
                    "gpus": [{"memory_bytes": "80GB"}],
                    "host_cache_bytes": "200GB",
                    "disk_cache_bytes": "2TB",
                }
            ],
            "bandwidth": {"l3_bytes_per_s": "1GB/s", "l2_bytes_per_s": "7GB/s", "l1_bytes_per_s": "50GB/s"},
        }
    )
    runtime = Runtime(settings, catalog, cluster, config=PlannerConfig())
    with runtime:
        runtime.core.observe(report(time.time()))
        app = create_app(
            runtime.core,
            settings.scheduler,
            ready=runtime.ready,
            accept_hint=runtime.accept_hint,
            active=lambda: runtime.active,
            status=runtime.status_sources(),
        )
        with BackgroundServer(app) as http:
            yield http.url, runtime


@pytest.fixture
def browser() -> Iterator[webdriver.Chrome]:
    chromium, driver = need_tool("chromium"), need_tool("chromedriver")
    options = Options()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    chrome = webdriver.Chrome(options=options, service=Service(driver))
    try:
        yield chrome
    finally:
        chrome.quit()


def rows(browser: webdriver.Chrome, table: str) -> list[str]:
    return [
        str(tr.get_attribute("data-model"))
        for tr in browser.find_elements(By.CSS_SELECTOR, f"#{table} tbody tr")
    ]


def test_status_page_shows_the_scheduler_s_models_and_updates_after_a_hint(
    server: tuple[str, Runtime], browser: webdriver.Chrome
) -> None:
    url, runtime = server
    assert runtime.active
    assert sample("prewarm_scheduler_active") == 1  # the replica that holds the lease says so
    wait = WebDriverWait(browser, 30, poll_frequency=0.2)
    browser.get(f"{url}/status")
    browser.find_element(By.ID, "token").send_keys(READER.split(":")[1])
    browser.find_element(By.ID, "signin").click()

    wait.until(lambda b: sorted(rows(b, "models")) == sorted(MODELS))
    node = browser.find_element(By.CSS_SELECTOR, '#nodes [data-node="gpu-a"]').text
    assert "GPU 0" in node
    assert "search-embed [GPU 0]" in node
    assert "chat-7b (prefetched, unused)" in node
    # The session is a cookie no script can read, sent to this site alone.
    [session] = [c for c in browser.get_cookies() if c["name"] == "prewarm_session"]
    assert session["httpOnly"] is True
    assert session["sameSite"] == "Strict"
    assert "prewarm_session" not in browser.execute_script("return document.cookie")
    assert rows(browser, "hints") == []

    loaded_at = browser.execute_script("return performance.timeOrigin")
    posted = httpx.post(
        f"{url}/v1/hints",
        json={"model": "org/vision-13b", "eta_s": 0, "ttl_s": 600},
        headers={"Authorization": f"Bearer {WRITER.split(':')[1]}"},
        timeout=10,
    )
    assert posted.status_code == 202, posted.text

    wait.until(lambda b: rows(b, "hints") == ["org/vision-13b"])
    wait.until(lambda b: "org/vision-13b" in rows(b, "upcoming") + rows(b, "recent"))
    hinted = browser.find_element(By.CSS_SELECTOR, '#models tr[data-model="org/vision-13b"]').text
    assert " 1 " in f" {hinted} "  # its hint count
    assert browser.execute_script("return performance.timeOrigin") == loaded_at  # no reload
