from __future__ import annotations

from pathlib import Path

import pytest

from prewarm import InvalidInput
from sim import read_hints


def test_each_row_of_a_hints_csv_is_a_hint_received_at_its_timestamp(tmp_path: Path) -> None:
    path = tmp_path / "hints.csv"
    path.write_text("timestamp,model,ttl_s\n1704067200,chat-7b,600\n2024-01-01T01:00:00Z,code-34b,120.5\n")
    hints = read_hints(path)
    assert [(h.model, h.ttl_s, h.received_at, h.eta_s) for h in hints] == [
        ("chat-7b", 600.0, 1704067200.0, 0.0),
        ("code-34b", 120.5, 1704070800.0, 0.0),
    ]


@pytest.mark.parametrize(
    ("row", "column"),
    [
        ("yesterday,chat-7b,600", "timestamp"),
        ("1704067200,chat-7b,-1", "ttl_s"),
        ("1704067200,,600", "model"),
        ("1704067200,chat-7b,nan", "ttl_s: Input should be a finite number"),
        ("1704067200000,chat-7b,600", "timestamp: .*milliseconds"),
    ],
)
def test_a_bad_hint_row_is_invalid_input_naming_its_line(tmp_path: Path, row: str, column: str) -> None:
    path = tmp_path / "hints.csv"
    path.write_text(f"timestamp,model,ttl_s\n1704067200,chat-7b,600\n{row}\n")
    with pytest.raises(InvalidInput, match=f"line 3, column {column}"):
        read_hints(path)


def test_a_hints_file_without_its_columns_is_invalid_input(tmp_path: Path) -> None:
    path = tmp_path / "hints.csv"
    path.write_text("when,model\n1704067200,chat-7b\n")
    with pytest.raises(InvalidInput, match="ttl_s"):
        read_hints(path)


def test_an_iso_time_without_a_zone_is_utc_as_in_trace_files(tmp_path: Path) -> None:
    path = tmp_path / "hints.csv"
    path.write_text("timestamp,model,ttl_s\n2024-01-01T01:00:00,chat-7b,600\n")
    assert read_hints(path)[0].received_at == 1704070800.0
