"""API keys and per-key rates (gateway/auth.py), on a fake clock; the flags that turn them on."""
from __future__ import annotations

import pytest

from laps_agent.gateway.http.auth import RELOAD_CHECK_S, ApiKeys, RateLimiter


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_only_listed_keys_match_and_only_digests_are_kept(tmp_path):
    path = tmp_path / "keys"
    path.write_text("# comment\nsk-one\n\n  sk-two \n")
    keys = ApiKeys(path)
    assert keys.match("sk-one") and keys.match("sk-two")
    assert keys.match("sk-three") is None and keys.match("") is None and keys.match("# comment") is None
    assert b"sk-one" not in b"".join(keys._digests)


def test_a_changed_file_is_re_read_and_a_broken_one_keeps_the_old_keys(tmp_path):
    path, clock = tmp_path / "keys", Clock()
    path.write_text("sk-old\n")
    keys = ApiKeys(path, clock=clock)
    path.write_text("sk-new-and-longer\n")
    assert keys.match("sk-old")                     # not checked again yet
    clock.now += RELOAD_CHECK_S
    assert keys.match("sk-new-and-longer") and keys.match("sk-old") is None
    path.write_text("\n# rotation half-written\n")
    clock.now += RELOAD_CHECK_S
    assert keys.match("sk-new-and-longer")          # an empty file locks nobody out


def test_an_empty_keys_file_is_refused_at_start(tmp_path):
    path = tmp_path / "keys"
    path.write_text("\n# none\n")
    with pytest.raises(ValueError, match="no API key"):
        ApiKeys(path)


def test_the_bucket_allows_a_second_s_burst_then_says_when_to_retry():
    clock = Clock()
    limiter = RateLimiter(2.0, clock=clock)
    a, b = b"a" * 32, b"b" * 32
    assert limiter.take(a) is None and limiter.take(a) is None   # burst of 2
    assert limiter.take(a) == 1                                  # one token in 0.5 s: retry in 1 s
    assert limiter.take(b) is None                               # another key has its own bucket
    clock.now += 0.5
    assert limiter.take(a) is None and limiter.take(a) == 1
    slow = RateLimiter(0.1, clock=clock)
    assert slow.take(a) is None and slow.take(a) == 10


@pytest.mark.parametrize("argv, message", [
    (["--rate-limit-per-key", "1"], "needs --api-keys-file"),
    (["--api-keys-file", "/nonexistent/keys"], "No such file"),
])
def test_gateway_and_local_refuse_unusable_auth_flags_at_start(argv, message, capsys):
    from laps_agent.gateway import cli
    from laps_agent.local import stack as local

    for main in (cli.main, local.main):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == 2
        assert message in capsys.readouterr().err
