from __future__ import annotations

import pytest

from prewarm import MAX_EPOCH_S, InvalidInput, epoch_seconds, iso_utc
from prewarm_cli._common import parse_time


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1700000000", 1_700_000_000.0),
        ("1700000000.5", 1_700_000_000.5),
        ("2023-11-14T22:13:20Z", 1_700_000_000.0),
        ("2023-11-14T22:13:20", 1_700_000_000.0),  # no zone named: UTC, as trace and hints files
        ("2023-11-14T23:13:20+01:00", 1_700_000_000.0),
    ],
)
def test_epoch_seconds_reads_numbers_and_iso_times_in_utc(text: str, seconds: float) -> None:
    assert epoch_seconds(text) == seconds


def test_iso_utc_writes_the_second_in_utc_that_epoch_seconds_reads_back() -> None:
    assert iso_utc(1_700_000_000.0) == "2023-11-14T22:13:20Z"
    assert epoch_seconds(iso_utc(1_700_000_000.7)) == 1_700_000_000.0  # to the second


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("1700000000000", "milliseconds or microseconds"),
        (str(MAX_EPOCH_S), "milliseconds or microseconds"),
        ("nan", "expected epoch seconds or ISO-8601"),
        ("inf", "expected epoch seconds or ISO-8601"),
        ("yesterday", "expected epoch seconds or ISO-8601"),
    ],
)
def test_epoch_seconds_refuses_what_is_not_a_time_of_this_era_and_says_why(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        epoch_seconds(text)


def test_a_command_line_time_in_milliseconds_is_refused_naming_its_option() -> None:
    with pytest.raises(InvalidInput, match=r"--now: '1700000000000' is not epoch seconds of this era"):
        parse_time("1700000000000", "--now")
