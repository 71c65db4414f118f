"""Settings for a test that runs scheduler and executor parts on the local stack's Kafka.

Shared by the scheduler's runtime tests and the system tests (the tests folder is on ``sys.path``
through its rootdir conftest, so both import it by name).
"""

from __future__ import annotations

from pathlib import Path

from prewarm import Settings, load_settings

__all__ = ["settings_for_stack"]


def settings_for_stack(kafka_bootstrap: str, unique: str, tmp_path: Path, **overrides: str) -> Settings:
    """Settings on the local stack's Kafka with topics of this test only, and a job store of its own."""
    return load_settings(
        overrides={
            "kafka_bootstrap": kafka_bootstrap,
            "topic_orders": f"orders-{unique}",
            "topic_executor_state": f"state-{unique}",
            "database_url": f"sqlite:///{tmp_path / 'scheduler.db'}",
            "data_dir": str(tmp_path),
            "plan_interval_s": "1",
            **overrides,
        }
    )
