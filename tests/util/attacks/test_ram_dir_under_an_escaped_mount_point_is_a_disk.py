"""Issue #37 item 2: "No plaintext outside memory cubepack controls". private-cubes.md: a whole
cube is decrypted "into a private RAM folder ... (tmpfs: `/dev/shm`, or `CUBEPACK_RAM_DIR`)";
"Where there is no RAM file system (macOS), opening is refused rather than written to a disk";
ramdir.ram_root: "UnsupportedError: ... ``CUBEPACK_RAM_DIR`` names a disk".

The attack: ``CUBEPACK_RAM_DIR`` names a disk folder mounted (here bind-mounted from the root
ext4) at a mount point whose name holds a space, inside a tmpfs. /proc/self/mounts writes that
mount point with the space escaped (``x\\040y``), so the lookup, matching raw path strings,
never finds it, walks up to the tmpfs around it, and takes the disk for RAM: a private cube's
plaintext goes to the disk. (The same escaping refuses a real tmpfs mounted at such a name.)
Needs root and unshare (a private mount namespace), as the PID-namespace test does."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest


def test_a_disk_folder_at_a_mount_point_with_a_space_is_not_taken_for_ram(tmp_path):
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare for a private mount namespace")
    outer, disk = tmp_path / "outer", tmp_path / "disk"
    outer.mkdir()
    disk.mkdir()
    inner = outer / "x y"
    probe = textwrap.dedent(f"""
        import os
        from pathlib import Path
        from cubepack.errors import UnsupportedError
        from cubepack._util import ramdir
        os.environ["CUBEPACK_RAM_DIR"] = {str(inner)!r}
        try:
            with ramdir.ram_folder() as folder:
                (folder / "plaintext").write_text("decrypted memory")
                print("WROTE", folder)
                print("ON DISK", [p.name for p in Path({str(disk)!r}).iterdir()])
        except UnsupportedError as exc:
            print("REFUSED", exc)
    """)
    script = (f"mount -t tmpfs none {outer} && mkdir -p '{inner}' && "
              f"mount --bind {disk} '{inner}' && {sys.executable} -c \"$PROBE\"")
    done = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True,
                          env={**os.environ, "PROBE": probe}, check=False)
    if "mount:" in done.stderr:
        pytest.skip(f"cannot mount here: {done.stderr.strip()}")
    assert "REFUSED" in done.stdout, (f"a folder on the root ext4 was taken for RAM: "
                                      f"{done.stdout.strip()} {done.stderr[-300:]}")
