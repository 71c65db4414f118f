"""``prewarm demo``'s engine step, as the coordinator calls it: real executor and engine processes."""

from __future__ import annotations

from pathlib import Path

from prewarm_cli._demo_engine import MODEL, PROMPT, run_engine_demo


def test_the_demo_engine_starts_warm_from_l1_reading_no_weights_from_disk(tmp_path: Path) -> None:
    report = run_engine_demo(tmp_path / "demo")

    assert report["ok"] is True
    assert report["model"] == MODEL
    assert report["executor_l1_load"]["tier"] == "L1"
    assert report["l1_resident"] == [MODEL]
    assert report["engine_read_bytes_from_l1"] == 0
    assert report["identical_to_files"] is True
    assert report["tokens"][: len(PROMPT)] == PROMPT
    assert len(report["tokens"]) == len(PROMPT) + 8
    assert report["ours_imported"] == []  # the engine imported prewarm_client, nothing else of ours
    assert report["weights_bytes"] > 0
    assert {"model-00001-of-00002.safetensors", "config.json"} <= set(report["files"])
    assert not (tmp_path / "demo" / "sockets" / "prewarm.sock").exists()  # the executor was stopped
