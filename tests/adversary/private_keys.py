"""Keys for the private-cube adversary tests (issue #32): age X25519 identities written as
age-keygen writes them (mode 0600), and a copy helper that encrypts a packed cube."""

from __future__ import annotations

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
