"""The trace readers: every format gives the same frame, and bad rows are named by line and column."""

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


def test_azure_2019_day_files_read_together_are_consecutive_days_in_the_order_given(
    azure_sample: Path, tmp_path: Path
) -> None:
    # The dataset publishes one file a day; each alone starts at the same midnight.
    day = read_trace(azure_sample, "azure2019")
    both = read_trace([azure_sample, azure_sample], "azure2019")
    assert len(both) == 2 * len(day)
    first, second = both.iloc[: len(day)], both.iloc[len(day) :]
    pd.testing.assert_frame_equal(first.reset_index(drop=True), day)
    assert np.allclose(second["timestamp"].to_numpy() - day["timestamp"].to_numpy(), 86400.0)
    counts = azure2019_minute_counts([azure_sample, azure_sample])
    assert counts.shape == (2 * 1440, 4)
    assert (counts.iloc[1440:].to_numpy() == counts.iloc[:1440].to_numpy()).all()
    assert counts.index[1440] == AZURE2019_DEFAULT_START + 86400
    requests = _write(tmp_path, "timestamp,model\n10,a\n30,a\n")
    assert read_trace([requests, requests], "requests")["timestamp"].tolist() == [10.0, 10.0, 30.0, 30.0]


def test_azure_2019_day_files_joined_into_one_are_refused_with_what_to_do_instead(
    azure_sample: Path, tmp_path: Path
) -> None:
    # Joined with their headers, as ``cat`` joins them: the second day's header is a row of the first.
    text = azure_sample.read_text().rstrip("\n") + "\n"
    with pytest.raises(InvalidInput, match=r"line \d+ is a header again.*give each day's file"):
        read_trace(_write(tmp_path, text + text), "azure2019")


def test_azure_bad_count_is_named_by_line_and_column(tmp_path: Path) -> None:
    header = "HashOwner,HashApp,HashFunction,Trigger," + ",".join(str(i) for i in range(1, 1441))
    row = "o,a," + "ab" * 32 + ",http," + ",".join(["0"] * 4 + ["x"] + ["0"] * 1435)
    with pytest.raises(InvalidInput, match="line 2, column 5"):
        read_trace(_write(tmp_path, header + "\n" + row + "\n"), "azure2019")


def test_requests_file_read_as_azure_is_invalid_input(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="HashFunction"):
        read_trace(_write(tmp_path, "timestamp,model\n1,a\n"), "azure2019")


def test_an_azure_2021_invocation_arrives_when_it_started_its_function_named_as_in_2019(
    azure_samples: Path,
) -> None:
    raw = pd.read_csv(azure_samples / "Azure2021_200.csv")
    events = read_trace(azure_samples / "Azure2021_200.csv", "azure2021")
    assert len(events) == len(raw)
    assert np.all(np.diff(events["timestamp"].to_numpy()) >= 0)
    first = raw.loc[(raw["end_timestamp"] - raw["duration"]).idxmin()]
    assert events["timestamp"].iloc[0] == pytest.approx(
        AZURE2019_DEFAULT_START + first["end_timestamp"] - first["duration"]
    )
    assert events["model"].iloc[0] == f"fn-{first['func'][:16]}"
    assert set(events["model"]) == {f"fn-{f[:16]}" for f in raw["func"]}
    later = read_trace(azure_samples / "Azure2021_200.csv", "azure2021", start=AZURE2019_DEFAULT_START + 60)
    assert np.allclose(later["timestamp"].to_numpy() - events["timestamp"].to_numpy(), 60.0)


@pytest.mark.parametrize(
    ("row", "where"),
    [
        ("a1,{f},12.5,-1", "line 2, column duration"),
        ("a1,{f},soon,0.5", "line 2, column end_timestamp"),
        ("a1,not-a-hash,12.5,0.5", "line 2, column func"),
    ],
)
def test_a_bad_azure_2021_row_is_named_by_line_and_column(tmp_path: Path, row: str, where: str) -> None:
    body = "app,func,end_timestamp,duration\n" + row.format(f="ab" * 32) + "\n"
    with pytest.raises(InvalidInput, match=where):
        read_trace(_write(tmp_path, body), "azure2021")


def test_an_azure_2021_file_read_as_requests_says_which_format_reads_it(azure_samples: Path) -> None:
    with pytest.raises(InvalidInput, match="--format azure2021"):
        read_trace(azure_samples / "Azure2021_200.csv", "requests")
