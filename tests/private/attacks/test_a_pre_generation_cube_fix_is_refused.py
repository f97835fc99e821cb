"""Issue #37 item 3 and the principle "the suggested fix works". A private cube written before
generations (its lock's ``encryption`` version 1, as cubepack of issue #32 wrote it) is still
read, its ``replay`` check skipped, and the skip says how to give it a generation: "rekey it to
give it one (cubepack rekey CUBE --identity KEY --rotate --sign-key KEY)".

The attack is a new user following the message literally on an unsigned cube of that age (the
docs' own first example, ``cubepack pack CUBE --encrypt-to ...``, signs nothing): ``rekey
--rotate --sign-key`` is refused, since a rekey keeps an unsigned cube's recipients only under a
trusted signature, and re-signs only a cube whose current signature verifies (there is none).
What works there is ``--to RECIPIENT`` for each reader (the message names neither it nor that
``--sign-key`` wants a signing key, not the age identity the two ``KEY`` suggest)."""

from __future__ import annotations

import hashlib
import json
import re
import shutil

import pytest
from private_keys import age_keys

from cubepack._util import constants
from cubepack.ops._encrypt import encrypt

from helpers import cli_in_process, make_key


def written_before_generations(cube, identity, recipient):
    """``cube`` (private to ``recipient``) rewritten as cubepack of issue #32 wrote it (the
    helper of tests/private/test_private.py)."""
    from cubepack._util import canonical
    from cubepack.format import _lock as lockfile
    from cubepack.trust import _age as age

    lock = json.loads((cube / constants.LOCK_FILENAME).read_text())
    name = lock["encryption"]["manifest"]
    manifest = json.loads(bytes(age.decrypt((cube / name).read_bytes(),
                                            age.load_identities(identity), name)))
    old = {key: manifest[key] for key in ("format", "lock", "names", "recipients")}
    data = bytes(age.encrypt(canonical.dumps({**old, "version": 1}).encode(),
                             age.parse_recipients([recipient])))
    (cube / name).write_bytes(data)
    lock["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    section = {key: value for key, value in lock["encryption"].items()
               if key not in ("series", "generation")}
    (cube / constants.LOCK_FILENAME).write_text(lockfile.dumps(lockfile.build_lock(
        cube_id=lock["cube_id"], files=lock["files"], models=lock["models"], activations={},
        cubepack_version=lock["cubepack_version"], encryption={**section, "version": 1})))


def test_the_fix_the_replay_skip_prints_gives_the_cube_a_generation(packed, tmp_path):
    pytest.importorskip("pyrage")
    pytest.importorskip("model_signing")
    import os

    keys = age_keys(tmp_path, "alice")
    signer, _ = make_key(tmp_path, "signer")
    cube = tmp_path / "cube"
    shutil.copytree(packed, cube)
    encrypt(cube, [keys["alice"][1]])
    written_before_generations(cube, keys["alice"][0], keys["alice"][1])
    env = {**{k: v for k, v in os.environ.items() if k != "CUBEPACK_IDENTITY"}}
    done = cli_in_process(["verify", str(cube), "--json"], env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    [detail] = [c["detail"] for c in json.loads(done.stdout)["checks"]
                if c["check"] == "replay"]
    command = re.search(r"\(cubepack (rekey .*--key SIGNING_KEY)\)", detail).group(1)
    assert command == ("rekey CUBE --identity IDENTITY --to RECIPIENT (once for each reader), "
                       "then cubepack sign CUBE --key SIGNING_KEY"), detail  # unsigned
    # Followed literally: the identity is the age key, one reader, then the user's signer.
    first, second = command.replace(" (once for each reader)", "").split(", then cubepack ")
    args = first.split()
    args[args.index("CUBE")] = str(cube)
    args[args.index("IDENTITY")] = str(keys["alice"][0])
    args[args.index("RECIPIENT")] = keys["alice"][1]
    signing = second.split()
    signing[signing.index("CUBE")] = str(cube)
    signing[signing.index("SIGNING_KEY")] = str(signer)
    fixed = cli_in_process(args, env=env, cwd=tmp_path)
    assert fixed.returncode == 0, f"the printed fix {command!r} failed:\n{fixed.stderr}"
    fixed = cli_in_process(signing, env=env, cwd=tmp_path)
    assert fixed.returncode == 0, f"the printed fix {command!r} failed:\n{fixed.stderr}"
    lock = json.loads((cube / constants.LOCK_FILENAME).read_text())
    assert lock["encryption"]["generation"] == 1
