"""Adversary (issue #38, round 2): `ROOT/server.lock` is opened following symlinks, created and
truncated: a symlink planted there makes `hub serve` replace the file it points to with a pid.

The promise: docs/reference/local-hub.md: "One server process serves a root: it holds a lock
on `ROOT/server.lock` (naming its pid) while it runs" (a file of the root, the endpoint's own);
SECURITY.md holds cubepack's other writers to files they own, never one reached through a
symlink ("a cloned tree holding a symlink is refused and removed before anything reads it";
`cubepack upgrade` stages "none reached through a symlink"). A file outside the root is never
the endpoint's to write. (Severity low: the attacker needs write access to the root folder.)

The attack: someone who can write the root's folder (a root shared by a team on one machine:
`--root /srv/hub`, group-writable) replaces `server.lock` with a symlink to a file of the user
who runs `hub serve` (here `notes.txt` beside the root; `~/.bashrc` would do). `ServeLock`
opens it with `O_RDWR | O_CREAT` (no `O_NOFOLLOW`), takes the lock, `ftruncate(0)`, and
writes its pid.

What happened: after `LocalHub(root).start()` and `stop()`, `notes.txt` holds only the server's
pid (`'7028\\n'`); its three lines are gone. The test asks that a file outside the root be
left as it was (refuse a symlinked lock file, or lock one of the endpoint's own making).
"""

from __future__ import annotations

import os

from cubepack.localhub import LocalHub

from envs import once

# The endpoint's own code over raw HTTP or in process, no Hub client: the same in both
# environments (huggingface_hub only validates its ids, fixed valid ones here).
pytestmark = once


def test_a_symlinked_server_lock_leaves_its_target_alone(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    victim = tmp_path / "notes.txt"
    victim.write_text("a user's notes\n" * 3)
    os.symlink(victim, root / "server.lock")
    try:
        LocalHub(root).start().stop()
    except Exception:  # noqa: BLE001 - a refusal leaves the target as it was: that holds too
        pass
    assert victim.read_text() == "a user's notes\n" * 3, (
        f"hub serve wrote through the symlinked server.lock: {victim.read_text()!r}")


def test_a_hard_linked_or_special_server_lock_is_refused(tmp_path):
    """The same attack by a hard link (O_NOFOLLOW does not see it), and by a FIFO (an open
    that would block): refused, naming the file, the target left as it was."""
    import pytest

    from cubepack.errors import UsageError

    root = tmp_path / "root"
    root.mkdir()
    victim = tmp_path / "notes.txt"
    victim.write_text("a user's notes\n" * 3)
    os.link(victim, root / "server.lock")
    with pytest.raises(UsageError, match="hard link"):
        LocalHub(root)
    assert victim.read_text() == "a user's notes\n" * 3
    (root / "server.lock").unlink()
    os.mkfifo(root / "server.lock")
    with pytest.raises(UsageError, match="not a regular file"):
        LocalHub(root)
    (root / "server.lock").unlink()
    LocalHub(root).start().stop()  # the endpoint's own lock file
