"""Keys for the private-cube attack reproductions (issue #32): age X25519 identities written as
age-keygen writes them (mode 0600), and a copy helper that encrypts a packed cube."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path


def age_keys(folder: Path, *names: str) -> dict[str, tuple[Path, str]]:
    """name -> (identity file, recipient), each identity file mode 0600."""
    import pyrage

    keys = {}
    for name in names:
        identity = pyrage.x25519.Identity.generate()
        path = folder / f"{name}.key"
        path.write_text(f"# public key: {identity.to_public()}\n{identity}\n")
        os.chmod(path, 0o600)
        keys[name] = (path, str(identity.to_public()))
    return keys


def private_copy(source: Path, target: Path, recipients: list[str], **options) -> Path:
    """A copy of the packed cube ``source`` at ``target``, encrypted to ``recipients``."""
    from cubepack.ops._encrypt import encrypt

    shutil.copytree(source, target)
    encrypt(target, recipients, **options)
    return target


def x25519_secret(identity_file):
    """The X25519 identity in ``identity_file`` (the native reader's)."""
    from cubepack.trust import _age_stream as stream

    line = next(line for line in identity_file.read_text().splitlines()
                if line.startswith("AGE-SECRET-KEY-"))
    return stream.X25519Identity(stream.bech32_bytes(line, "age-secret-key-"))


def reseal_private(cube, change=lambda lock: None) -> None:
    """The public lock re-sealed over the files as they are now (an unsigned cube: anyone can)."""
    from cubepack._util import constants
    from cubepack.format import _lock as lockfile

    path = cube / constants.LOCK_FILENAME
    lock = json.loads(path.read_text())
    for name in lock["files"]:
        data = (cube / name).read_bytes()
        lock["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    change(lock)
    path.write_text(lockfile.dumps(lockfile.build_lock(
        cube_id=lock["cube_id"], files=lock["files"], models=lock["models"], activations={},
        cubepack_version=lock["cubepack_version"], encryption=lock["encryption"])))
