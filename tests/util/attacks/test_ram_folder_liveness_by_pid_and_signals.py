"""Issue #37 item 2: "RAM folders: liveness by a lock held on the folder, not by a pid, so a
process in another PID namespace sharing /dev/shm never removes a live one; SIGHUP, SIGQUIT,
SIGUSR1 and SIGINT clean up as SIGTERM does."

A RAM folder was named after its process's pid, and the next ``ram_folder`` of the same user
removed every folder whose pid it could not signal: a container sharing ``/dev/shm`` (its own
PID namespace: pids that mean nothing here, or another process's) had its live folder of
plaintext removed under it. The other process is simulated as the issue allows: a live
holder whose folder records a pid that is no process here (the pid of a child that exited).

Only SIGTERM unwound: SIGHUP (a closed terminal or ssh session), SIGQUIT (Ctrl-\\, which also
dumps core) and SIGUSR1 ended the command at once, no ``finally`` ran, and the decrypted cube
stayed in ``/dev/shm``. The command is paused inside its decrypted folder by a pipe (no
sleeps), signalled, and the folder is looked at after it exited.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from places import ROOT
from private_keys import age_keys, private_copy

from cubepack._util import ramdir

pytestmark = pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="needs /dev/shm")

#: Holds a RAM folder whose name records ``argv[1]`` as its pid (a pid that is no process
#: here), prints its path, waits on stdin.
HOLDER = r"""
import os, sys
from cubepack._util import ramdir
os.getpid = lambda: int(sys.argv[1])
with ramdir.ram_folder() as folder:
    (folder / "plain.txt").write_text("held")
    print(folder, flush=True)
    sys.stdin.readline()
"""

#: ``cubepack verify --identity`` as the CLI runs it, paused (on stdin) once a check of the
#: decrypted clear cube begins: it prints the RAM folder's path, then waits.
PAUSED_VERIFY = r"""
import signal, sys
from cubepack.ops import _verify

# The dispositions a command started from a terminal has: a runner under nohup (or a CI
# agent) starts its children with SIGHUP ignored, and an ignored signal ends nothing, so there
# is nothing to clean up (cubepack leaves a disposition it did not find at the default alone).
for name in ("SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1"):
    signal.signal(getattr(signal, name), signal.SIG_DFL)

real = _verify._check_files

def paused(report, *args, **kwargs):
    if "cubepack-private-" in str(report.cube_dir):
        print(report.cube_dir, flush=True)
        sys.stdin.readline()
    return real(report, *args, **kwargs)

_verify._check_files = paused
from cubepack.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUBEPACK_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def _gone_pid() -> int:
    """A pid that is no process here (a child that exited and was reaped)."""
    done = subprocess.Popen(["true"])
    done.wait()
    return done.pid


def test_a_live_folder_whose_pid_is_no_process_here_is_kept_until_its_holder_dies():
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(_gone_pid())], env=_env(),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    folder = Path(holder.stdout.readline().strip())
    try:
        assert (folder / "plain.txt").is_file()
        with ramdir.ram_folder():  # another process's open: removes stale folders first
            pass
        assert (folder / "plain.txt").is_file(), "a live RAM folder was removed as stale"
        holder.kill()  # SIGKILL: no cleanup of its own; now the folder is stale
        holder.wait()
        with ramdir.ram_folder():
            pass
        assert not folder.exists(), "a stale RAM folder (its holder killed) was kept"
    finally:
        holder.kill()
        holder.wait()
        shutil.rmtree(folder, ignore_errors=True)


def _wait_for_the_lock(folder: Path) -> None:
    import fcntl

    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # blocks until no process holds the folder
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


#: The same holder, its pid its own namespace's.
NAMESPACED = HOLDER.replace("os.getpid = lambda: int(sys.argv[1])\n", "")


def test_a_folder_held_in_another_pid_namespace_is_kept_until_its_holder_dies():
    """The real thing where ``unshare`` may make a PID namespace (root): the holder is pid 1
    of its own namespace, and its folder's name says so."""
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "--pid", "--fork", "true"],
                                         capture_output=True).returncode != 0:
        pytest.skip("cannot make a PID namespace here (unshare needs root)")
    holder = subprocess.Popen([unshare, "--pid", "--fork", "--kill-child", sys.executable, "-c",
                               NAMESPACED], env=_env(), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    folder = Path(holder.stdout.readline().strip())
    try:
        assert folder.name.startswith("cubepack-private-1.")  # pid 1: of its namespace
        with ramdir.ram_folder():
            pass
        assert (folder / "plain.txt").is_file(), "a live RAM folder was removed as stale"
        holder.kill()  # unshare, and with it (--kill-child) the holder
        holder.wait()
        _wait_for_the_lock(folder)  # the holder's SIGKILL lands asynchronously
        with ramdir.ram_folder():
            pass
        assert not folder.exists(), "a stale RAM folder (its holder killed) was kept"
    finally:
        holder.kill()
        holder.wait()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT,
                                    signal.SIGUSR1, signal.SIGINT],
                         ids=lambda s: signal.Signals(s).name)
def test_each_terminating_signal_leaves_no_plaintext_in_ram(signum, packed, tmp_path):
    pytest.importorskip("cryptography")
    keys = age_keys(tmp_path, "alice")
    cube = private_copy(packed, tmp_path / "cube", [keys["alice"][1]])
    process = subprocess.Popen([sys.executable, "-c", PAUSED_VERIFY, "verify", str(cube),
                                "--identity", str(keys["alice"][0])], env=_env(),
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    folder = Path(process.stdout.readline().strip())
    try:
        assert folder.name.startswith("cubepack-private-") and any(folder.rglob("*.safetensors"))
        process.send_signal(signum)
        code = process.wait(timeout=60)
        left = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")) \
            if folder.exists() else []
        assert left == [], f"plaintext left in {folder} after {signal.Signals(signum).name}"
        assert code == 128 + signum, process.stderr.read()
    finally:
        process.kill()
        process.wait()
        shutil.rmtree(folder, ignore_errors=True)
