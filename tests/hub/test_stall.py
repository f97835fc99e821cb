"""The low-speed rule: a pull or push whose requests together move fewer than
CUBEPACK_LOW_SPEED_LIMIT bytes/s for CUBEPACK_LOW_SPEED_TIME s ends with one HubError naming
the stall, well before the overall deadline, which stays for large honest transfers. Run under
huggingface_hub 2.x (httpx) and 0.36 (requests) alike. The arithmetic (``Windows``) is tested
alone too, with a clock of its own: simulated pools sharing a link at rates around the limit.

The endpoint misbehaves on its own (an InstrumentedHub fault: send or read one byte, then wait
until the test ends), so the stall comes about however slow the machine is; the tests shorten
the rule's time so it comes quickly, and assert only what the error says and what was left,
never how long anything took. The overall deadline is a safety net (HANG) never reached."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from cubepack import HubError, UsageError
from cubepack._util import constants
from cubepack.hub import pull, push
from cubepack.hub._stall import LowSpeed, Windows
from cubepack.testing.hub import InstrumentedHub

from helpers import tree_bytes
from hub_deadlines import HANG, KEPT, cubepack_cli, nothing_left_running, published

BIG = "activations/big.kv.safetensors"
#: The rule the tests run under: 1 KiB/s over 2 s (the defaults are 1 KiB/s over 30 s). Two
#: seconds, not one: the pull's honest requests (a few hundred bytes each, answered at once)
#: must not wait that long for an answer on a loaded machine.
TIME = "2"


@pytest.fixture(scope="module")
def big_cube(packed_cube_factory):
    """A cube with one ~4 MB activation: a trickled transfer of it never completes."""
    return packed_cube_factory({"big": list(range(4, 402)), "small": [5, 6, 7]})


@pytest.fixture
def hub(tmp_path):
    with InstrumentedHub(tmp_path / "hub") as server:
        yield server


@pytest.fixture
def target(tmp_path):
    folder = tmp_path / "target"
    folder.mkdir()
    (folder / "kept.txt").write_bytes(KEPT["kept.txt"])
    return folder


@pytest.fixture
def quick_rule(monkeypatch):
    monkeypatch.setenv("CUBEPACK_LOW_SPEED_LIMIT", "1024")
    monkeypatch.setenv("CUBEPACK_LOW_SPEED_TIME", TIME)


def assert_names_the_stall(message, action, hub, what):
    assert message.startswith(f"The {action} stalled: {hub.url} moved "), message
    assert re.search(f"while {what}, under the low-speed limit of 1,024 bytes/s for {TIME} s "
                     r"\(CUBEPACK_LOW_SPEED_LIMIT / CUBEPACK_LOW_SPEED_TIME\)", message), message
    assert re.search(r"moved [0-9,]+ bytes in [0-9.]+ s \([0-9,.]+ bytes/s(, its [0-9]+ requests "
                     r"in flight together)?\)", message), message
    assert "Retry" in message and "raise CUBEPACK_LOW_SPEED_TIME" in message
    assert "check the endpoint" in message and "\n" not in message


# --- pulls -------------------------------------------------------------------------------------
@pytest.mark.parametrize("seconds", [None, 0.05], ids=["one-byte-then-silence",
                                                      "a-byte-every-50ms"])
def test_a_trickled_download_stalls_naming_file_bytes_and_rate(hub, big_cube, target, tmp_path,
                                                               quick_rule, seconds):
    """A byte every 50 ms (20 bytes/s) never leaves a read waiting long enough for any
    per-read timeout: only the rate gives it away, as with a byte every 2 s against the
    defaults."""
    sha = published(hub, big_cube)
    trickle = hub.add_fault("trickle", path=r"/resolve/.*big\.kv", method="GET", times=100,
                            seconds=seconds)
    with pytest.raises(HubError) as caught:
        pull(f"ns/slow@{sha}", endpoint=hub.url, local_dir=target, force=True,
             cache_dir=tmp_path / "c", timeout=HANG)
    message = str(caught.value)
    assert_names_the_stall(message, "pull of ns/slow", hub, re.escape(f"downloading {BIG}"))
    size = (big_cube / BIG).stat().st_size
    assert re.search(rf"; [0-9,]+ of {size:,} bytes arrived\. ", message), message
    assert message.endswith(f"Nothing was placed: {target} is as it was.")
    stall = caught.value.details["stall"]
    assert stall["file"] == BIG and stall["phase"] == f"downloading {BIG}"
    assert stall["answered"] and stall["bytes_total"] == size
    assert 0 <= stall["bytes_received"] < 1024 * int(TIME) and stall["rate"] < 1024
    assert stall["limit"] == 1024 and stall["time"] == int(TIME)
    assert tree_bytes(target) == KEPT
    nothing_left_running()
    trickle.times = 0  # an honest endpoint again: the same pull succeeds
    assert pull(f"ns/slow@{sha}", endpoint=hub.url, local_dir=target, force=True,
                cache_dir=tmp_path / "c", timeout=HANG).report.ok


def test_an_honest_download_slower_than_the_window_but_above_the_limit_completes(
        hub, big_cube, tmp_path, monkeypatch):
    """~4 MB sent 64 KiB at a time with 1/16 s between (~1 MiB/s, a few seconds: several of
    the rule's windows) against a limit of 32 KiB/s over 2 s: slow, yet far above the limit."""
    monkeypatch.setenv("CUBEPACK_LOW_SPEED_LIMIT", str(32 * 1024))
    monkeypatch.setenv("CUBEPACK_LOW_SPEED_TIME", TIME)
    sha = published(hub, big_cube)
    slow = hub.add_fault("trickle", path=r"/resolve/.*big\.kv", method="GET", times=100,
                         seconds=1 / 16, step=64 * 1024)
    result = pull(f"ns/slow@{sha}", endpoint=hub.url, local_dir=tmp_path / "out",
                  cache_dir=tmp_path / "c", timeout=HANG)
    assert result.report.ok and slow.hits == 1
    assert (tmp_path / "out" / BIG).read_bytes() == (big_cube / BIG).read_bytes()


# --- pushes ------------------------------------------------------------------------------------
def test_an_upload_read_a_byte_at_a_time_stalls_and_commits_nothing(hub, big_cube, quick_rule):
    trickle = hub.add_fault("trickle", path=r"^/lfs/upload/", method="PUT", times=100,
                            seconds=None)
    with pytest.raises(HubError) as caught:
        push(big_cube, "ns/slow", endpoint=hub.url, allow_local_paths=True, timeout=HANG)
    message = str(caught.value)
    assert_names_the_stall(message, "push to ns/slow", hub, r"uploading activations/\S+")
    assert re.search(r"; [0-9,]+ of [0-9,]+ bytes sent, ", message), message
    assert "push again" in message
    stall = caught.value.details["stall"]
    assert stall["file"].startswith("activations/") and stall["request"].startswith("PUT /lfs/")
    assert stall["bytes_to_send"] == (big_cube / stall["file"]).stat().st_size
    assert hub.stats.commits == 0
    nothing_left_running()
    trickle.times = 0
    assert push(big_cube, "ns/slow", endpoint=hub.url, allow_local_paths=True).changed


def test_a_commit_read_a_byte_at_a_time_stalls_and_lands_nothing(hub, big_cube, quick_rule):
    trickle = hub.add_fault("trickle", path=r"/commit/", method="POST", times=100, seconds=None)
    with pytest.raises(HubError) as caught:
        push(big_cube, "ns/slow", endpoint=hub.url, allow_local_paths=True, timeout=HANG)
    message = str(caught.value)
    assert_names_the_stall(message, "push to ns/slow", hub,
                           "waiting for POST /api/datasets/ns/slow/commit/main")
    assert "bytes sent, no answer yet" in message
    assert caught.value.details["stall"]["answered"] is False
    assert hub.stats.commits == 0
    nothing_left_running()
    trickle.times = 0
    assert push(big_cube, "ns/slow", endpoint=hub.url, allow_local_paths=True).changed


# --- the CLI -----------------------------------------------------------------------------------
def test_the_cli_reports_a_stall_as_a_hub_error_with_its_details_in_json(hub, big_cube, target,
                                                                         tmp_path):
    sha = published(hub, big_cube)
    hub.add_fault("trickle", path=r"/resolve/.*big\.kv", method="GET", times=100, seconds=None)
    code, out, _ = cubepack_cli(hub, tmp_path, "pull", f"ns/slow@{sha}", "--local-dir", target,
                                "--force", "--json", env={"CUBEPACK_LOW_SPEED_LIMIT": "1024",
                                                          "CUBEPACK_LOW_SPEED_TIME": TIME})
    error = json.loads(out)["error"]
    assert code == 3 and error["type"] == "HubError" and error["exit_code"] == 3
    assert error["message"].startswith("The pull of ns/slow stalled")
    stall = error["details"]["stall"]
    assert stall["file"] == BIG and stall["endpoint"] == hub.url
    assert {"bytes_received", "bytes_total", "rate", "window_seconds", "limit", "time"} <= set(stall)
    assert stall["requests_in_flight"] == 1  # the other files were done: the big one alone
    assert tree_bytes(target) == KEPT
    # docs/reference/environment-stall.md shows every key the details carry, and no other.
    page = (Path(__file__).parents[2] / "docs" / "reference" / "environment-stall.md").read_text()
    shown = json.loads(page.split("$ cubepack pull ns/cube --json\n", 1)[1].split("```", 1)[0])
    assert set(shown["error"]["details"]["stall"]) == set(stall)


def test_the_cli_refuses_a_bad_low_speed_setting_as_a_usage_error(hub, tmp_path):
    code, out, _ = cubepack_cli(hub, tmp_path, "pull", "ns/x", "--json",
                                env={"CUBEPACK_LOW_SPEED_TIME": "soon"})
    assert code == 2 and "CUBEPACK_LOW_SPEED_TIME='soon' is not a number of seconds" in out


# --- the settings and the rule -----------------------------------------------------------------
def test_the_rule_defaults_to_1_kib_per_second_over_30_seconds(monkeypatch):
    monkeypatch.delenv("CUBEPACK_LOW_SPEED_LIMIT", raising=False)
    monkeypatch.delenv("CUBEPACK_LOW_SPEED_TIME", raising=False)
    assert constants.low_speed() == (1024, 30)
    assert LowSpeed.from_environment() == LowSpeed(1024, 30)
    monkeypatch.setenv("CUBEPACK_LOW_SPEED_LIMIT", "100")
    monkeypatch.setenv("CUBEPACK_LOW_SPEED_TIME", "5.5")
    assert LowSpeed.from_environment() == LowSpeed(100, 5.5)
    monkeypatch.setenv("CUBEPACK_LOW_SPEED_LIMIT", "0")
    assert LowSpeed.from_environment() is None  # off


@pytest.mark.parametrize(("name", "value", "said"), [
    ("CUBEPACK_LOW_SPEED_LIMIT", "-1", "must be a number of bytes per second >= 0"),
    ("CUBEPACK_LOW_SPEED_LIMIT", "fast", "is not a number of bytes per second"),
    ("CUBEPACK_LOW_SPEED_TIME", "0", "must be a positive number of seconds"),
    ("CUBEPACK_LOW_SPEED_TIME", "inf", "must be a positive number of seconds"),
    ("CUBEPACK_LOW_SPEED_TIME", "nan", "must be a positive number of seconds"),
])
def test_a_bad_setting_is_a_usage_error_naming_it(monkeypatch, tmp_path, name, value, said):
    monkeypatch.setenv(name, value)
    with pytest.raises(UsageError, match=f"{name}.*{said}"):
        constants.low_speed()
    with pytest.raises(UsageError, match=name):  # before anything is asked of an endpoint
        pull("ns/x", endpoint="http://127.0.0.1:9", local_dir=tmp_path / "x", timeout=HANG)


# --- the arithmetic: an operation's windows over the bytes all of its requests move ------------
def test_a_window_closes_when_its_quota_moved_and_stalls_when_it_does_not():
    rule = LowSpeed(limit=100, seconds=10)  # 1,000 bytes per 10 s window
    windows = Windows(rule)
    windows.open("a", now=0)
    assert windows.due() == 10 and windows.judge("a", now=9.9) is None
    windows.add(999, now=5)  # one byte short of the quota: the window stays open ...
    assert windows.judge("a", now=10) is not None  # ... and is judged stalled when due
    windows.add(1, now=6)  # the quota: a new window opens where it was reached
    assert windows.due() == 16 and windows.judge("a", now=15.9) is None
    verdict = windows.judge("a", now=16)
    assert (verdict.moved, verdict.seconds, verdict.rate, verdict.requests) == (0, 10, 0, 1)
    windows.add(500, now=12)  # 500 bytes in 10 s: 50 bytes/s, under 100
    verdict = windows.judge("a", now=16)
    assert verdict.rate == 50 and rule.details(verdict)["rate"] == 50
    assert rule.details(verdict)["requests_in_flight"] == 1
    windows.close("a")  # over: judged no more, and nothing is due
    assert windows.judge("a", now=100) is None and windows.due() is None


def test_every_window_counts_the_bytes_of_all_requests():
    """Bytes are the operation's (``add`` names no request): each window counts every byte
    moved since it opened, whichever request moved it."""
    windows = Windows(LowSpeed(limit=100, seconds=10))  # 1,000 bytes per 10 s window
    windows.open("a", now=0)
    windows.add(600, now=5)
    windows.open("b", now=6)  # "b"'s window counts from here: the 600 came before it
    windows.add(400, now=9)  # "a"'s quota moved: its next window opens at 9; "b" saw 400
    assert windows.due() == 16  # "b"'s, open since 6
    windows.add(600, now=15)  # "b"'s quota moved: its next window opens at 15; "a" saw 600
    assert windows.due() == 19 and windows.judge("b", now=16) is None
    verdict = windows.judge("a", now=19)
    assert (verdict.moved, verdict.seconds, verdict.requests) == (600, 10, 2)
    assert windows.judge("b", now=24.9) is None and windows.judge("b", now=25).moved == 0


def simulate(rate, slots, *, limit=100, seconds=10, tick=0.1, duration=200, split="even",
             gap=0.0, seed=0):
    """A pool of ``slots`` workers sharing a link of ``rate`` bytes/s (moving bytes only while
    a request is in flight), each downloading files of random sizes one after another with
    ``gap`` seconds of local work between; each tick the link's bytes are split among the
    requests in flight (``split``: "even", "one" (all to the oldest), or "random"). Returns
    (the first verdict or None, the most any request moved alone within ``seconds``)."""
    import random

    chance = random.Random(seed)
    windows = Windows(LowSpeed(limit, seconds))
    left = {}  # slot -> bytes its request still has to move
    resume = dict.fromkeys(range(slots), 0.0)  # slot -> when its next request is sent
    alone = {slot: [] for slot in range(slots)}  # slot -> (time, bytes) it moved
    for step in range(1, int(duration / tick) + 1):
        now = step * tick
        for slot in range(slots):
            if slot not in left and now >= resume[slot]:
                left[slot] = chance.randint(rate, 20 * rate)
                windows.open(slot, now)
        budget = rate * tick  # the link's bytes this tick, all of them moved while any wants
        while budget > 1e-9 and left:
            share = {"even": {slot: 1 / len(left) for slot in left},
                     "one": {min(left): 1.0}}.get(split)
            if share is None:
                weights = {slot: chance.random() for slot in left}
                share = {slot: weight / sum(weights.values()) for slot, weight in weights.items()}
            spent = 0.0
            for slot, part in share.items():
                moved = min(left[slot], budget * part)
                spent += moved
                left[slot] -= moved
                alone[slot].append((now, moved))
                windows.add(moved, now)
                if left[slot] <= 0:
                    del left[slot]
                    windows.close(slot)
                    resume[slot] = now + gap
            budget -= spent
        for slot in sorted(left):
            verdict = windows.judge(slot, now)
            if verdict is not None:
                return verdict, None
    best = 0.0  # the most one request moved within any ``seconds`` (a sliding window)
    for moves in alone.values():
        first, inside = 0, 0.0
        for when, moved in moves:
            inside += moved
            while moves[first][0] <= when - seconds:
                inside -= moves[first][1]
                first += 1
            best = max(best, inside)
    return None, best


@pytest.mark.parametrize("split", ["even", "one", "random"])
@pytest.mark.parametrize("gap", [0.0, 3.0])
@pytest.mark.parametrize("slots", [1, 2, 4, 5, 8])
def test_a_link_just_above_the_limit_never_stalls_however_many_requests_share_it(
        slots, gap, split):
    """The issue's case: each request alone moves under the limit (judged alone, each would
    stall), the link moves 1% above it: never a stall, however the link is shared."""
    verdict, best = simulate(101, slots, gap=gap, split=split, seed=slots)
    assert verdict is None
    if slots > 1 and split == "even" and gap == 0:
        assert best < 100 * 10  # no request alone moved the quota in any window


@pytest.mark.parametrize("split", ["even", "one", "random"])
@pytest.mark.parametrize("slots", [1, 2, 4, 5, 8])
def test_a_link_just_below_the_limit_stalls_within_one_window(slots, split):
    verdict, _ = simulate(99, slots, split=split, seed=slots)
    assert verdict is not None and verdict.seconds == pytest.approx(10)
    assert verdict.moved < 1000 and verdict.rate < 100 and 1 <= verdict.requests <= slots


@pytest.mark.parametrize(("rate", "stalls"), [(3000, False), (1100, False), (512, True)])
def test_environment_stall_md_s_table_four_downloads_at_the_defaults(rate, stalls):
    """docs/reference/environment-stall.md's arithmetic: 4 downloads, 1 KiB/s over 30 s."""
    verdict, alone = simulate(rate, 4, limit=1024, seconds=30, duration=300, seed=rate)
    assert (verdict is not None) is stalls
    if stalls:
        assert verdict.moved == pytest.approx(rate * 30, rel=0.01) and verdict.moved < 30 * 1024
    else:
        assert alone < 30 * 1024  # judged alone, each download would have stalled
    assert rate / 4 * 30 == {3000: 22500, 1100: 8250, 512: 3840}[rate]


def test_a_starved_request_among_fast_ones_stalls_once_they_are_done():
    windows = Windows(LowSpeed(limit=100, seconds=10))
    for key in ("starved", "fast1", "fast2"):
        windows.open(key, now=0)
    for second in range(1, 61):  # a minute at 200 bytes/s, all of it the fast ones'
        windows.add(200, now=second)
        assert windows.judge("starved", now=second) is None
    windows.close("fast1")
    windows.close("fast2")
    assert windows.judge("starved", now=69.9) is None
    verdict = windows.judge("starved", now=70)  # a window after the last byte moved
    assert verdict is not None and (verdict.moved, verdict.requests) == (0, 1)


def test_a_new_request_opens_its_own_window_and_an_ended_one_is_judged_no_more():
    windows = Windows(LowSpeed(limit=100, seconds=10))
    windows.open("first", now=0)
    windows.add(500, now=1)
    windows.open("second", now=8)  # its window counts from 8, "first"'s from 0
    windows.add(400, now=9)
    assert windows.judge("first", now=10).moved == 900
    assert windows.judge("second", now=17.9) is None
    windows.close("first")
    assert windows.due() == 18 and windows.judge("second", now=18).moved == 400


def test_a_retry_wait_is_judged_on_the_bytes_the_operations_other_requests_move():
    """The deadline's own bookkeeping: a retry wait (after a 503) in one thread is a request in
    flight whose window counts another thread's download bytes, and counts in
    ``requests_in_flight``. Time: bytes are added and judged at once (no window can be due),
    then the test sleeps past a window (a sleep never ends early) and judges."""
    import threading
    import time

    from cubepack.hub._deadline import Deadline

    deadline = Deadline(HANG, "http://endpoint", "pull of ns/x", low_speed=LowSpeed(1000, 0.2))

    def answered_503():
        transfer = deadline.begin("GET", "http://endpoint/datasets/ns/x/resolve/c/a.bin")
        deadline.answered(transfer, 0, None, 503, "600")
        deadline.end(transfer)  # the thread now waits to retry: a request in flight

    waiter = threading.Thread(target=answered_503)
    waiter.start()
    waiter.join()
    download = deadline.begin("GET", "http://endpoint/datasets/ns/x/resolve/c/b.bin")
    deadline.answered(download, 10_000, None, 200)
    deadline.progress(download, received=5_000)  # 25 windows' quota: both windows reopen now
    assert not deadline._judge()
    time.sleep(0.4)  # then nothing moves for two windows' time
    assert deadline._judge()
    error = deadline.error()
    stall = error.details["stall"]
    assert stall["retry_wait"] and stall["retry_after"] == "600"  # the oldest: the wait
    assert stall["requests_in_flight"] == 2 and stall["window_bytes"] == 0
    assert "its 2 requests in flight together) while waiting to retry GET" in str(error)
