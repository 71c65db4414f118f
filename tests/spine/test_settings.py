from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import SecretStr
from typer.testing import CliRunner

from prewarm import ConfigError, Settings, load_settings, parse_byte_rate, parse_bytes
from prewarm_cli import app

pytestmark = pytest.mark.usefixtures("clean_env")


def test_defaults_need_no_environment() -> None:
    settings = load_settings()
    assert settings.kafka.topic_requests == "prewarm.requests"
    assert settings.kafka.topic_dlq == "prewarm.requests.dlq"
    assert settings.database_url.startswith("sqlite:///")


def test_environment_beats_file_and_overrides_beat_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "prewarm.yaml"
    config.write_text("kafka:\n  topic_requests: from-file\napi_port: 9000\nl1_budget_bytes: 2GiB\n")
    monkeypatch.setenv("PREWARM_TOPIC_REQUESTS", "from-env")
    settings = load_settings(config, {"api_port": "9100"})
    assert settings.kafka.topic_requests == "from-env"
    assert settings.scheduler.api_port == 9100
    assert settings.executor.l1_budget_bytes == 2 * 2**30


def test_unknown_environment_setting_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREWARM_KAFKA_BOOTSTRAPP", "x:1")
    with pytest.raises(ConfigError, match="PREWARM_KAFKA_BOOTSTRAPP") as info:
        load_settings()
    assert info.value.setting == "PREWARM_KAFKA_BOOTSTRAPP"


def test_unknown_key_in_config_file_is_named(tmp_path: Path) -> None:
    config = tmp_path / "prewarm.yaml"
    config.write_text("topic_request: typo\n")
    with pytest.raises(ConfigError, match="topic_request"):
        load_settings(config)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("PREWARM_DATABASE_URL", "not a url"),
        ("PREWARM_S3_ENDPOINT", "ftp//broken"),
        ("PREWARM_KAFKA_BOOTSTRAP", "localhost"),
        ("PREWARM_API_PORT", "eighty"),
    ],
)
def test_malformed_setting_exits_2_naming_it(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    result = CliRunner().invoke(app, ["version"])
    assert result.exit_code == 2
    assert variable in result.output


def test_unknown_setting_exits_2_from_the_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREWARM_NO_SUCH_THING", "1")
    result = CliRunner().invoke(app, ["version"])
    assert result.exit_code == 2
    assert "PREWARM_NO_SUCH_THING" in result.output


def test_set_override_with_unknown_key_exits_2() -> None:
    result = CliRunner().invoke(app, ["--set", "nope=1", "version"])
    assert result.exit_code == 2
    assert "nope" in result.output


@pytest.mark.parametrize(
    ("text", "expected"),
    [("64MB", 64_000_000), ("2GiB", 2 * 2**30), ("1048576", 1_048_576), (" 1.5 GB ", 1_500_000_000)],
)
def test_sizes_are_read_in_decimal_and_binary_units(text: str, expected: int) -> None:
    assert parse_bytes(text) == expected


def test_rates_accept_per_second_suffix() -> None:
    assert parse_byte_rate("3.5GB/s") == 3.5e9


@pytest.mark.parametrize("text", ["12 parsecs", "-5MB", "", "1.5"])
def test_unreadable_sizes_are_rejected(text: str) -> None:
    with pytest.raises(ValueError, match="size"):
        parse_bytes(text)


def test_planner_knobs_come_from_scheduler_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from scheduler import PlannerConfig

    monkeypatch.setenv("PREWARM_MISS_PENALTY", "0")
    monkeypatch.setenv("PREWARM_MEMORY_PRICE", "0.2")
    config = PlannerConfig.from_settings(load_settings().scheduler)
    assert (config.miss_penalty, config.memory_price) == (0.0, 0.2)


def test_a_secret_set_in_the_environment_is_masked_in_prewarm_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PREWARM_HINT_TOKENS", "shop:s3cret-token")
    result = CliRunner().invoke(app, ["settings"])
    assert result.exit_code == 0, result.output
    assert "s3cret-token" not in result.output
    shown = json.loads(result.output)["scheduler"]
    assert shown["hint_tokens"] == "***"
    assert shown["publishable_tokens"] == ""  # unset: nothing to hide, and it says so


def test_secret_settings_keep_their_value_from_file_environment_and_override(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "prewarm.yaml"
    config.write_text("scheduler:\n  publishable_tokens: web:pk-file\n  hint_tokens: shop:from-file\n")
    monkeypatch.setenv("PREWARM_HINT_TOKENS", "shop:from-env")
    settings = load_settings(config)
    assert settings.scheduler.hint_tokens.get_secret_value() == "shop:from-env"
    assert settings.scheduler.publishable_tokens.get_secret_value() == "web:pk-file"
    overridden = load_settings(config, {"hint_tokens": "shop:from-set"})
    assert overridden.scheduler.hint_tokens.get_secret_value() == "shop:from-set"


def test_every_secret_setting_is_masked_by_its_type() -> None:
    """A secret added to any section later is masked without anyone listing it."""
    defaults = load_settings()
    sections = [type(getattr(defaults, name)) for name in Settings.model_fields]
    secrets = [
        name
        for section in sections
        for name, field in section.model_fields.items()
        if field.annotation is SecretStr
    ]
    assert {"hint_tokens", "publishable_tokens"} <= set(secrets)
    settings = load_settings(None, {name: f"src:value-of-{name}" for name in secrets})
    dumped = json.dumps(settings.model_dump(mode="json"))
    assert "value-of-" not in dumped
    assert "value-of-" not in repr(settings)
