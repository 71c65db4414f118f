"""The trace readers: both formats give the same frame, and bad rows are named by line and column."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ingest._traces import AZURE2019_DEFAULT_START, azure2019_minute_counts, read_trace
from prewarm import InvalidInput, validate_model_id


@pytest.fixture
def azure_sample(azure_samples: Path) -> Path:
    return azure_samples / "invocations.csv"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "trace.csv"
    path.write_text(text)
    return path


def test_requests_trace_accepts_epoch_and_iso_and_ignores_extra_columns(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "timestamp,model,latency\n1700000060.5,org/llama,3\n2023-11-14T22:13:20Z,mistral-7b,4\n",
    )
    frame = read_trace(path)
    assert list(frame.columns) == ["timestamp", "model"]
    assert frame["timestamp"].tolist() == [1700000000.0, 1700000060.5]  # sorted by time
    assert frame["model"].tolist() == ["mistral-7b", "org/llama"]


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ("1,a\nnot-a-time,b\n", "line 3, column timestamp"),
        ("1,a\n,b\n", "line 3, column timestamp"),
        ("1,a\n2,../etc\n", "line 3, column model"),
        ("1,a\n2,\n", "line 3, column model"),
        ("1,a\n2,b\n3,has space\n", "line 4, column model"),
    ],
)
def test_bad_request_row_is_named_by_line_and_column(tmp_path: Path, body: str, where: str) -> None:
    with pytest.raises(InvalidInput, match=where):
        read_trace(_write(tmp_path, "timestamp,model\n" + body))


def test_missing_header_column_is_invalid_input(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="timestamp,model"):
        read_trace(_write(tmp_path, "time,model\n1,a\n"))


def test_a_millisecond_epoch_is_named_by_its_line_not_read_as_a_date_millennia_ahead(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match=r"line 4, column timestamp: '1709942400124' .*milliseconds"):
        read_trace(_write(tmp_path, "timestamp,model\n1709942400,a\n1709942460,b\n1709942400124,a\n"))


def test_an_azure_file_read_as_requests_says_which_format_reads_it(azure_sample: Path) -> None:
    with pytest.raises(InvalidInput, match="--format azure2019") as caught:
        read_trace(azure_sample, "requests")
    assert len(str(caught.value)) < 300  # not the file's 1,444 column names


def test_missing_file_is_invalid_input(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="no such trace file"):
        read_trace(tmp_path / "absent.csv")


def test_azure_sample_events_rebucket_to_the_file_counts(azure_sample: Path) -> None:
    counts = azure2019_minute_counts(azure_sample)
    events = read_trace(azure_sample, "azure2019")
    assert counts.shape == (1440, 4)
    assert counts.index[0] == AZURE2019_DEFAULT_START
    for model in counts.columns:
        validate_model_id(model)
        assert model.startswith("fn-")
        assert len(model) == 3 + 16
    assert len(events) == int(counts.to_numpy().sum())
    assert np.all(np.diff(events["timestamp"].to_numpy()) >= 0)
    minute = (events["timestamp"] // 60 * 60).astype(np.int64)
    rebucketed = events.assign(minute=minute).groupby(["minute", "model"]).size().unstack(fill_value=0)
    rebucketed = rebucketed.reindex(index=counts.index, columns=counts.columns, fill_value=0)
    assert (rebucketed.to_numpy() == counts.to_numpy()).all()


def test_azure_start_shifts_every_timestamp_and_reading_is_deterministic(azure_sample: Path) -> None:
    a = read_trace(azure_sample, "azure2019")
    b = read_trace(azure_sample, "azure2019", start=AZURE2019_DEFAULT_START + 86400)
    assert np.allclose(b["timestamp"].to_numpy() - a["timestamp"].to_numpy(), 86400.0)
    pd.testing.assert_frame_equal(a, read_trace(azure_sample, "azure2019"))


def test_azure_bad_count_is_named_by_line_and_column(tmp_path: Path) -> None:
    header = "HashOwner,HashApp,HashFunction,Trigger," + ",".join(str(i) for i in range(1, 1441))
    row = "o,a," + "ab" * 32 + ",http," + ",".join(["0"] * 4 + ["x"] + ["0"] * 1435)
    with pytest.raises(InvalidInput, match="line 2, column 5"):
        read_trace(_write(tmp_path, header + "\n" + row + "\n"), "azure2019")


def test_requests_file_read_as_azure_is_invalid_input(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="HashFunction"):
        read_trace(_write(tmp_path, "timestamp,model\n1,a\n"), "azure2019")
