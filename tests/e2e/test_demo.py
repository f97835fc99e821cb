"""``make demo`` runs, shows the bug, the refusal and the pinned load as text answers, prints
commands that run as printed (after the demo, by hand, with the environment it prints), and
leaves nothing behind outside its folder (memos environment: it drives the real MemoryOS)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from cubepack.testing import reader

pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")


def test_the_demo_shows_why_and_the_fix_and_its_commands_run_as_printed(tmp_path):
    scratch = tmp_path / "tmpdir"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch)}
    done = subprocess.run([sys.executable, "-m", "cubepack.demo", str(tmp_path / "demo-out")],
                          capture_output=True, text=True, timeout=600, env=env, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    answers = dict(re.findall(r"^([\w' ]+): (.*)$", out, flags=re.MULTILINE))
    # The fact is only in the memory: A answers it from its cache and not without.
    assert answers["model A without the memory"] == "(an empty answer)"
    assert answers["model A with its own memory"] == "Berlin"
    # Plain MemOS: B, handed A's cache, answers another city, silently; from its own, Berlin.
    wrong = answers["plain MemOS hands A's cache to model B"]
    assert wrong != "Berlin" and wrong.split()[0] in reader.CITIES, wrong
    assert answers["model B with its own memory"] == "Berlin"
    assert re.search(r"^cubepack refuses: weights_digest: expected sha256:[0-9a-f]{64}, "
                     r"found sha256:[0-9a-f]{64}$", out, flags=re.MULTILINE)
    assert "Load it into the model that produced it" in out
    assert answers["the hook loads into A"] == "Berlin"
    # The tutorial shows this run: the answers and digests it prints are the ones printed here.
    page = (Path(__file__).resolve().parents[2] / "docs" / "tutorials" / "demo.md").read_text()
    assert f"plain MemOS hands A's cache to model B: {wrong}\n" in page
    assert "the answers (`Berlin`, `{}`, `Berlin`, `Berlin`)".format(wrong) in page
    digests = re.search(r"expected (sha256:[0-9a-f]{8})[0-9a-f]{56}, found "
                        r"(sha256:[0-9a-f]{8})[0-9a-f]{56}", out).groups()
    assert "expected {}..., found {}...".format(*digests) in page
    assert out.count("\n>>> ") >= 5               # every Python step shows its call
    commands = re.findall(r"^\$ (.*)$", out, flags=re.MULTILINE)
    script = str(Path(sys.executable).with_name("cubepack"))
    assert [shlex.split(c)[:2] for c in commands[:4]] == [
        [script, "hub"], [script, "pack"], [script, "push"], [script, "pull"]]
    assert "memos" not in done.stderr.lower()
    assert list(scratch.iterdir()) == []          # no temp folder left behind

    # By hand, as the end of the output says: the endpoint's data was kept.
    serve, export = re.findall(r"^  \$ (.*)$", out.split("re-run the commands")[1], re.MULTILINE)
    by_hand = dict(os.environ)
    by_hand.update(dict(pair.split("=", 1) for pair in shlex.split(export)[1:]))
    server = subprocess.Popen(shlex.split(serve.removesuffix(" &")), stdout=subprocess.PIPE,
                              text=True, env=by_hand)
    try:
        assert "serving" in server.stdout.readline()
        pull = shlex.split(commands[3])
        pull[pull.index("--local-dir") + 1] = str(tmp_path / "by-hand")
        again = subprocess.run(pull, capture_output=True, text=True, timeout=300, env=by_hand, check=False)
        assert again.returncode == 0, again.stdout + again.stderr
        assert "verified" in again.stdout
        # Its pack and push again, as printed: the cube and the tag are kept ("no changes";
        # the pin named the snapshot path the first time and its Hub id after, so the lock
        # changed and the tag refused the second push).
        for command, says in ((commands[1], "lock digest"), (commands[2], "no changes")):
            rerun = subprocess.run(shlex.split(command), capture_output=True, text=True,
                                   timeout=300, env=by_hand, check=False)
            assert rerun.returncode == 0 and says in rerun.stdout, rerun.stdout + rerun.stderr
    finally:
        server.terminate()
        server.wait()
