"""Adversary (issue #38, round 2): the preupload's work bound counts matches, not compiling the
patterns: one preupload naming one file costs ~10 times the CPU the page promises.

The promise: docs/reference/local-hub.md, What it serves: "its `.gitignore` and
`.gitattributes` (sent, or the repo's) are at most 64 KiB each [...] and (patterns) x
(characters of the paths) is at most 20,000,000 (about 0.2 s of CPU: the patterns are compiled
into one expression); beyond, 400 saying which". SECURITY.md names the preupload's bound among
the endpoint's resource attacks held.

The attack: `POST .../preupload/main` naming one file (`a.txt`), with a `gitIgnore` of 64 KiB of
short star patterns (`*a*`, ...: 16,383 of them) and a `gitAttributes` of one pattern of
64 KiB (`*?*?...*? filter=lfs`), both made unique per request (the compiled expressions are
cached by pattern list). Its work by the endpoint's measure: 16,384 patterns x 6 characters,
~100,000, far under 20,000,000. But `re.compile` of an expression built from 64 KiB of `fnmatch`
patterns (pure-Python `sre_parse`/`sre_compile`, holding the GIL) is not counted.

What happened (server process CPU, /proc/PID/stat): each such preupload costs ~1.2-1.4 s of
CPU (6-7 x the 0.2 s the page states; ~0.65 s to compile each file's patterns); a
client's 16 connections at once keep 16 threads on the GIL. The test asks that one preupload
within the bound cost at most 0.6 s of CPU.
"""

from __future__ import annotations

import json
import os
import time

from hub_users import Served, raw

TOKEN = "writer"
LIMIT = 64 * 1024
MAX_CPU_SECONDS = 0.6


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def fill(line_of, limit):
    lines, size, index = [], 0, 0
    while True:
        line = line_of(index)
        if size + len(line) + 1 > limit:
            return "\n".join(lines)
        lines.append(line)
        size += len(line) + 1
        index += 1


def test_a_preupload_within_its_bound_costs_what_the_page_says(tmp_path):
    nonce = os.urandom(4).hex()
    ignore = fill(lambda i: "*a*" if i else f"*{nonce}*", LIMIT)
    attributes = nonce + "*?" * ((LIMIT - 40) // 2) + " filter=lfs"  # one pattern of 64 KiB
    body = json.dumps({"files": [{"path": "a.txt", "size": 10, "sample": ""}],
                       "gitIgnore": ignore, "gitAttributes": attributes}).encode()
    with Served(tmp_path / "root", "--token", TOKEN) as served:
        assert raw(served.url, "POST", "/api/repos/create", json.dumps(
            {"name": "repo", "organization": "ns", "type": "dataset"}).encode(), TOKEN)[0] == 200
        pid = served.process.pid
        before, started = cpu_seconds(pid), time.monotonic()
        status, answer = raw(served.url, "POST", "/api/datasets/ns/repo/preupload/main", body,
                             TOKEN, {"Content-Type": "application/json"})
        took, cpu = time.monotonic() - started, cpu_seconds(pid) - before
    assert status == 200, (status, answer)  # within every bound the page names
    assert cpu <= MAX_CPU_SECONDS, (
        f"one preupload of one file within the bounds ({len(body):,} bytes) cost {cpu:.2f} s "
        f"of the endpoint's CPU (answered in {took:.2f} s); the page says about 0.2 s")
