"""The spine's registry of URI schemes: what every catalog reader accepts, whoever registered it."""

from __future__ import annotations

import pytest

from prewarm import InvalidInput, known_schemes, register_scheme


def test_s3_and_file_are_built_in() -> None:
    assert {"s3", "file"} <= set(known_schemes())


def test_registering_a_scheme_twice_lists_it_once() -> None:
    register_scheme("prewarm-test-twice")
    register_scheme("prewarm-test-twice")
    assert known_schemes().count("prewarm-test-twice") == 1
    assert list(known_schemes()) == sorted(known_schemes())


@pytest.mark.parametrize("name", ["", "3ds", "S3", "has space", "with://"])
def test_a_name_that_is_not_a_uri_scheme_is_refused(name: str) -> None:
    with pytest.raises(InvalidInput, match="not a URI scheme"):
        register_scheme(name)
    assert name not in known_schemes()
