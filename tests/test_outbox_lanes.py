"""Per-peer lanes: in-flight limits and the circuit (docs/protocol.md §10 "Isolation"), without
I/O."""

from __future__ import annotations

import random

import pytest

from masd.edges.lanes import FAILURES_TO_OPEN, RELAY, Lanes, origin

T0 = 1_700_000_000.0


def lanes(limit: int = 2) -> Lanes:
    return Lanes(lambda key: 1 if key == RELAY else limit, rng=random.Random(7))


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://127.0.0.1:9001/mas", "http://127.0.0.1:9001"),
        ("HTTP://Mode.Example/mas?x=1", "http://mode.example:80"),
        ("https://mode.example/a/b", "https://mode.example:443"),
        ("https://mode.example:8443/", "https://mode.example:8443"),
        ("http://[::1]:9001/mas", "http://[::1]:9001"),
        ("http://user:pw@mode.example:81/", "http://mode.example:81"),
        ("mode.example/mas", None),
        ("http://[::1/mas", None),
        ("http://mode.example:99999/", None),
    ],
)
def test_origin_is_scheme_host_and_port(url: str, expected: str | None) -> None:
    assert origin(url) == expected


def test_a_lane_admits_up_to_its_limit_and_frees_slots_on_release() -> None:
    ls = lanes(limit=2)
    assert ls.take("http://a:80", T0) is False
    assert ls.take("http://a:80", T0) is False
    assert ls.take("http://a:80", T0) is None  # full
    assert ls.take("http://b:80", T0) is False  # another peer is not held up
    assert ls.take(RELAY, T0) is False
    assert ls.take(RELAY, T0) is None
    assert ls.rooms(T0) == {"http://b:80": 1}
    ls.release("http://a:80")
    assert ls.take("http://a:80", T0) is False


def test_failures_in_a_row_open_the_circuit_then_a_probe_closes_it() -> None:
    ls = lanes(limit=100)
    key = "http://a:80"
    for n in range(FAILURES_TO_OPEN - 1):
        ls.take(key, T0)
        assert ls.judge(key, False, T0, probe=False) is None, n
        ls.release(key)
    ls.take(key, T0)
    assert ls.judge(key, False, T0, probe=False) == "opened"
    ls.release(key)
    lane = ls[key]
    assert lane.open_until is not None
    assert T0 + 0.5 <= lane.open_until <= T0 + 1.0  # the first step of the backoff, with jitter
    assert ls.take(key, T0) is None
    assert key not in ls.rooms(T0)
    assert ls.next_open(T0) == lane.open_until

    # After the cool-down one probe goes, and only one.
    later = lane.open_until
    assert ls.rooms(later) == {key: 1}
    assert ls.take(key, later) is True
    assert ls.take(key, later) is None
    assert ls.judge(key, True, later, probe=True) == "closed"
    ls.release(key)
    assert lane.open_until is None
    assert ls.take(key, later) is False
    assert ls.next_open(later) is None


def test_a_failed_probe_opens_the_circuit_again_for_longer() -> None:
    ls = lanes(limit=100)
    key = "http://a:80"
    now = T0
    for _ in range(FAILURES_TO_OPEN):
        ls.take(key, now)
        ls.judge(key, False, now, probe=False)
        ls.release(key)
    cooldowns = []
    for _ in range(12):
        now = ls[key].open_until or now
        assert ls.take(key, now) is True
        assert ls.judge(key, False, now, probe=True) == "reopened"
        ls.release(key)
        cooldowns.append((ls[key].open_until or 0) - now)
    assert cooldowns[0] >= 1.0  # the second step: 2 s with jitter
    assert cooldowns[-1] <= 300.0  # capped at 5 min
    assert cooldowns[-1] >= 150.0


def test_an_answer_resets_the_count_of_failures() -> None:
    ls = lanes(limit=100)
    key = "http://a:80"
    for _ in range(3):
        for _ in range(FAILURES_TO_OPEN - 1):
            ls.judge(key, False, T0, probe=False)
        ls.judge(key, True, T0, probe=False)  # a 2xx or a 4xx: the peer answered
    assert ls[key].open_until is None


def test_no_verdict_neither_opens_nor_closes_but_frees_the_probe() -> None:
    ls = lanes(limit=100)
    key = "http://a:80"
    for _ in range(FAILURES_TO_OPEN):
        ls.judge(key, False, T0, probe=False)
    later = (ls[key].open_until or 0) + 1
    assert ls.take(key, later) is True
    assert ls.judge(key, None, later, probe=True) is None  # e.g. cancelled at stop
    ls.release(key)
    assert ls[key].open_until is not None
    assert ls.take(key, later) is True  # another probe may go


def test_stragglers_failing_while_open_do_not_extend_the_cool_down() -> None:
    ls = lanes(limit=100)
    key = "http://a:80"
    for _ in range(FAILURES_TO_OPEN):
        ls.judge(key, False, T0, probe=False)
    until = ls[key].open_until
    for _ in range(20):
        assert ls.judge(key, False, T0 + 0.1, probe=False) is None
    assert ls[key].open_until == until
