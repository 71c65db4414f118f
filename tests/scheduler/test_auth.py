from __future__ import annotations

from pathlib import Path

import pytest

from prewarm import ConfigError, Forbidden, Unauthorized
from scheduler._auth import Authenticator, RateLimiter, Role


def test_tokens_can_come_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text("# one per line\nshop:abc\nops:def  # ops team\n")
    auth = Authenticator(f"@{path}")
    assert auth.authenticate("Bearer def").source == "ops"
    assert auth.first_token() == "abc"


def test_malformed_entry_is_named_by_position_without_its_text() -> None:
    with pytest.raises(ConfigError, match="entry 2") as info:
        Authenticator("shop:abc,topsecretwithoutcolon")
    assert "topsecret" not in str(info.value)


def test_publishable_token_carries_its_model_list() -> None:
    principal = Authenticator("", "web:pk:chat|search").authenticate("Bearer pk")
    assert principal.publishable
    assert principal.may_hint("chat")
    assert not principal.may_hint("other")


def test_scheme_other_than_bearer_is_unauthorized() -> None:
    auth = Authenticator("shop:abc")
    with pytest.raises(Unauthorized):
        auth.authenticate("Basic abc")
    with pytest.raises(Forbidden):
        auth.authenticate("Bearer abd")
    assert "abc" not in repr(auth)


def test_token_bucket_refills_at_its_rate() -> None:
    limiter = RateLimiter(rate_per_s=2.0, burst=2)
    assert [limiter.acquire("a", 0.0) for _ in range(3)] == [0.0, 0.0, 0.5]
    assert limiter.acquire("a", 0.5) == 0.0
    assert limiter.acquire("b", 0.5) == 0.0


def test_the_demand_source_cannot_be_given_a_token() -> None:
    with pytest.raises(ConfigError, match="reserved"):
        Authenticator("demand:abc")


def test_a_read_token_reads_and_posts_nothing() -> None:
    auth = Authenticator("shop:abc", "", "dashboard:rd")
    assert auth.reader("Bearer rd").source == "dashboard"
    with pytest.raises(Forbidden, match="read token"):
        auth.writer("Bearer rd")
    assert auth.first_token() == "abc"  # the benchmark posts hints: never a read token


def test_a_publishable_token_posts_and_reads_nothing() -> None:
    auth = Authenticator("shop:abc", "web:pk:chat")
    assert auth.writer("Bearer pk").may_hint("chat")
    with pytest.raises(Forbidden, match="publishable"):
        auth.reader("Bearer pk")
    assert auth.reader("Bearer abc").role is Role.WRITER


def test_one_token_in_two_roles_is_refused_without_showing_it() -> None:
    with pytest.raises(ConfigError, match="give each its own") as info:
        Authenticator("shop:same-secret", "", "dashboard:same-secret")
    assert "same-secret" not in str(info.value)
    # The same entry twice is only a repetition.
    assert Authenticator("shop:abc,shop:abc").authenticate("Bearer abc").source == "shop"


def test_a_reader_may_be_named_like_the_demand_source() -> None:
    # Reserved for hints only: a reader's name is a label, it never becomes a hint's source.
    assert Authenticator(read_tokens="demand:rd").reader("Bearer rd").source == "demand"
