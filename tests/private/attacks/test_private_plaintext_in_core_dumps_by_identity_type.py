"""Issue #37 item 2: "for every identity type (age X25519, ssh-ed25519, ssh-rsa, armored
files, passphrase-protected SSH keys), no private plaintext is ever held in a Python
bytes/str or in a library's memory cubepack cannot clear; test: a core of a dumpable child
process, taken after a load and its release, holds no marker, for each identity type."

SSH identities went through pyrage, which returned the plaintext as Python bytes (and left
its own copies in the Rust allocator's freed memory); ``open_private`` decrypted every file of
a cube into a bytearray on the heap before writing it to the RAM folder. Freed memory is not
cleared, so a core dump taken after the load was released still held the plaintext.

A dumpable child process runs each load path cubepack has, releases what it got, and scans
every region a core dump would hold (``coredump.holds``: the kernel's filter, less
MADV_DONTDUMP; the child never holds a marker except as cubepack decrypted it: it is handed
each marker shifted by one byte). Each path's file carries its own marker in its tensor bytes
(the plaintext's bulk; a KV header's fields are parsed into Python objects, the open break
kept by test_private_kv_header_fields_land_in_core_dumps.py), so a leak is named by path:

- ``load_kv_cache(decrypt_with=)`` (private anonymous memory, its tensors view it);
- ``decrypted_file`` (the MLX path: an anonymous memory file);
- ``open_private`` (the RAM folder of verify and the MemOS hook: tmpfs pages, not heap);
- ``verify(decrypt_with=)`` (open_private, then every check of the clear cube).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from coredump import shift
from places import ROOT, SUPPORT

pytestmark = [pytest.mark.skipif(sys.platform != "linux", reason="/proc/self/smaps is Linux's"),
              pytest.mark.skipif(not shutil.which("ssh-keygen"), reason="needs ssh-keygen")]

PATHS = ("load_kv_cache", "decrypted_file", "open_private", "verify")
MARKERS = {path: f"QZXJ-{path.upper()}-MARK-8h2k" for path in PATHS}
PASSPHRASE = "correct horse battery staple"

#: identity type -> (ssh-keygen arguments or None for an age key, passphrase, armored files)
TYPES = {
    "x25519": (None, None, False),
    "x25519-armored": (None, None, True),
    "ssh-ed25519": (["-t", "ed25519"], None, False),
    "ssh-rsa": (["-t", "rsa", "-b", "2048"], None, False),
    "ssh-ed25519-passphrase": (["-t", "ed25519"], PASSPHRASE, False),
    "ssh-rsa-passphrase": (["-t", "rsa", "-b", "2048"], PASSPHRASE, True),
}

CHILD = r"""
import gc, json, os, sys
from pathlib import Path
import coredump
from cubepack.testing import tiny

args = json.loads(sys.argv[1])
found = {}
model = tiny.load(args["model"])
import cubepack
from cubepack.ops._private import decrypted_file, open_private

found["before"] = coredump.holds_any(list(args["shifted"].values()))

cache = cubepack.load_kv_cache(args["kv"], model, decrypt_with=args["identity"])
assert cache.get_seq_length() > 0
del cache
gc.collect()
found["load_kv_cache"] = coredump.holds(args["shifted"]["load_kv_cache"])

with decrypted_file(args["file"], args["identity"]) as clear:
    assert os.stat(clear).st_size > 0
found["decrypted_file"] = coredump.holds(args["shifted"]["decrypted_file"])

with open_private(args["cube"], args["identity"]) as opened:
    assert any(opened.folder.rglob("*.kv.safetensors"))
gc.collect()
found["open_private"] = coredump.holds(args["shifted"]["open_private"])

report = cubepack.verify(args["checked"], decrypt_with=args["identity"], raise_on_failure=False)
assert report.ok, [str(c) for c in report.failures]
del report
gc.collect()
found["verify"] = coredump.holds(args["shifted"]["verify"])
found["dumpable"] = coredump.dumpable()
print(json.dumps(found))
"""


def _marked_kv(model, path: Path, marker: str) -> Path:
    """A KV file of ``model`` whose first key tensor's bytes are ``marker`` over and over (so
    a copy partly overwritten once freed still shows; ASCII bytes as a float's high bytes:
    finite values)."""
    import torch

    import cubepack

    ids = torch.tensor([[3, 4, 5, 6, 7, 8, 9, 10]])
    cache = cubepack.prefill(model, ids)
    keys = cache.layers[0].keys
    raw = keys.contiguous().view(-1).view(torch.uint8)
    text = marker.encode("ascii") * (len(raw) // len(marker) + 1)
    raw[:] = torch.tensor(list(text[:len(raw)]), dtype=torch.uint8)
    cache.layers[0].keys = raw.view(keys.dtype).view(keys.shape)
    return cubepack.save_kv_cache(cache, path, producer=model, token_ids=ids[0])


def _cube(model, zoo, folder: Path, marker: str) -> Path:
    import cubepack

    (folder / "activations").mkdir(parents=True)
    _marked_kv(model, folder / "activations" / "item.kv.safetensors", marker)
    cubepack.pack(folder, cube_id="me/marked", model=str(zoo["a"]))
    return folder


def _identity(folder: Path, name: str) -> tuple[Path, str]:
    """(identity file, recipient) of the identity type ``name``."""
    keygen, passphrase, _ = TYPES[name]
    path = folder / name
    if keygen is None:
        import pyrage

        identity = pyrage.x25519.Identity.generate()
        path.write_text(f"# public key: {identity.to_public()}\n{identity}\n")
        os.chmod(path, 0o600)
        return path, str(identity.to_public())
    subprocess.run(["ssh-keygen", "-q", *keygen, "-N", passphrase or "", "-C", "x@y", "-f",
                    str(path)], check=True)
    return path, path.with_suffix(".pub").read_text().strip()


def _armor(path: Path) -> None:
    import base64

    data = base64.b64encode(path.read_bytes())
    lines = [data[i:i + 64] for i in range(0, len(data), 64)]
    path.write_bytes(b"-----BEGIN AGE ENCRYPTED FILE-----\n" + b"\n".join(lines)
                     + b"\n-----END AGE ENCRYPTED FILE-----\n")


def _encrypted(source: Path, target: Path, recipient: str, armored: bool) -> Path:
    from cubepack.trust import _age as age

    target.write_bytes(bytes(age.encrypt(source.read_bytes(),
                                         age.parse_recipients([recipient]))))
    if armored:
        _armor(target)
    return target


@pytest.fixture(scope="module")
def clear(zoo, models, tmp_path_factory):
    """The clear material, one marker a load path: two KV files and two packed cubes."""
    folder = tmp_path_factory.mktemp("marked")
    return {"kv": _marked_kv(models["a"], folder / "kv.kv.safetensors",
                             MARKERS["load_kv_cache"]),
            "file": _marked_kv(models["a"], folder / "file.kv.safetensors",
                               MARKERS["decrypted_file"]),
            "cube": _cube(models["a"], zoo, folder / "cube", MARKERS["open_private"]),
            "checked": _cube(models["a"], zoo, folder / "checked", MARKERS["verify"])}


@pytest.mark.parametrize("kind", sorted(TYPES))
def test_no_marker_in_a_dumpable_core_after_each_load_and_release(kind, clear, zoo, tmp_path):
    pytest.importorskip("pyrage")
    from cubepack.ops._encrypt import encrypt

    identity, recipient = _identity(tmp_path, kind)
    armored = TYPES[kind][2]
    args = {"model": str(zoo["a"]), "identity": str(identity),
            "shifted": {path: shift(marker) for path, marker in MARKERS.items()},
            "kv": str(_encrypted(clear["kv"], tmp_path / "kv.age", recipient, armored)),
            "file": str(_encrypted(clear["file"], tmp_path / "file.age", recipient, armored))}
    for name in ("cube", "checked"):
        shutil.copytree(clear[name], tmp_path / name)
        encrypt(tmp_path / name, [recipient])
        args[name] = str(tmp_path / name)
    env = {key: value for key, value in os.environ.items() if not key.startswith("CUBEPACK_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(SUPPORT), env.get("PYTHONPATH", "")])
    if TYPES[kind][1]:
        env["CUBEPACK_IDENTITY_PASSPHRASE"] = TYPES[kind][1]
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(args)], env=env,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found.pop("dumpable") and not found.pop("before")
    assert found == dict.fromkeys(PATHS, False), f"{kind}: marker in a core dump after {found}"
