"""The low-speed rule: a request of a pull or push that moves fewer than
CUBEPACK_LOW_SPEED_LIMIT bytes/s for CUBEPACK_LOW_SPEED_TIME s ends the operation with one
HubError naming the stall, well before the overall deadline, which stays for large honest
transfers. Run under huggingface_hub 2.x (httpx) and 0.36 (requests) alike.

The endpoint misbehaves on its own (an InstrumentedHub fault: send or read one byte, then wait
until the test ends), so the stall comes about however slow the machine is; the tests shorten
the rule's time so it comes quickly, and assert only what the error says and what was left,
never how long anything took. The overall deadline is a safety net (HANG) never reached."""

from __future__ import annotations

import json
import re

import pytest

from cubepack import HubError, UsageError
from cubepack._util import constants
from cubepack.hub import pull, push
from cubepack.hub._stall import LowSpeed
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
    assert re.search(r"moved [0-9,]+ bytes in [0-9.]+ s \([0-9,.]+ bytes/s\)", message), message
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
    assert tree_bytes(target) == KEPT


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


class Request:
    """What the rule reads and writes on a request."""

    def __init__(self, rule, now):
        self.moved, self.window = 0, rule.opened(now)


def test_a_window_closes_when_its_quota_moved_and_stalls_when_it_does_not():
    rule = LowSpeed(limit=100, seconds=10)  # 1,000 bytes per 10 s window
    request = Request(rule, now=0)
    assert rule.due(request) == 10 and rule.judge(request, now=9.9) is None
    request.moved = 999  # one byte short of the quota: the window stays open ...
    rule.moved(request, now=5)
    assert rule.judge(request, now=10) is not None  # ... and is judged stalled when due
    request.moved = 1000  # the quota: a new window opens where it was reached
    rule.moved(request, now=6)
    assert request.window == (6, 1000) and rule.due(request) == 16
    assert rule.judge(request, now=15.9) is None
    verdict = rule.judge(request, now=16)
    assert (verdict.moved, verdict.seconds, verdict.rate) == (0, 10, 0)
    request.moved = 1500  # 500 bytes in 10 s: 50 bytes/s, under 100
    verdict = rule.judge(request, now=16)
    assert verdict.rate == 50 and rule.details(verdict)["rate"] == 50


def test_a_steady_rate_just_above_the_limit_never_stalls_and_just_below_does():
    rule = LowSpeed(limit=100, seconds=10)
    for rate, stalls in ((101, False), (99, True)):
        request, stalled = Request(rule, now=0), False
        for tick in range(1, 1001):  # 100 s, a chunk every 0.1 s
            now = tick / 10
            request.moved += rate / 10
            rule.moved(request, now=now)
            stalled = stalled or rule.judge(request, now) is not None
        assert stalled is stalls, rate
