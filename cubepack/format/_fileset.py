"""Which file of a cube folder is what: the one rule pack, verify, sign, push and pull apply.

Every relative path in a cube folder has one role:

- **generated**: written by pack from the rest: the lock, ``cubepack.yaml``, the card;
- **signing**: written by signing, over the lock: ``cubepack.sig`` and the attestation
  ``cubepack.intoto.json`` (it names the lock, so the lock cannot list it);
- **bookkeeping**: what a download leaves behind: huggingface_hub's local-dir folder
  (``.cache/huggingface/``: ``hf download --local-dir``; huggingface_hub's ``_local_folder``
  owns its layout, a test checks we name the same folder) and pull's origin record
  (``.cache/cubepack/``). Never locked, never signed, never uploaded: it describes this copy,
  not the cube, and whoever pulled wrote it;
- **ciphertext** (a private cube, issue #32): an age file (``<clear name>.age``, or an opaque
  ``private/<hex>.age`` when item ids are hidden) whose plaintext is one file of the clear
  cube byte for byte, and the private manifest ``cubepack.manifest.age`` (the clear cube's
  lock: every plaintext digest). Locked like any file, by the ciphertext's sha256 and size, so
  the signature over the lock covers the ciphertexts (encrypt-then-sign); the lock's
  ``encryption`` section names which they are;
- **locked**: everything else, listed in the lock with its sha256 and size.

From the roles: a cube may hold unlisted (*tolerated*) the lock itself, the signing files,
``.gitattributes`` (the Hub puts one in every repo) and bookkeeping. The signature hashes
every file but itself, the bookkeeping (:data:`SIGNATURE_IGNORES`, handed to model_signing,
which records it in the signature so stock ``model_signing verify`` ignores the same) and
top-level git paths (model_signing's own rule); a locked file it skips is still covered,
through the lock it signs. Tolerated files are still read by a strict parser for their kind
(``content``).
"""

from __future__ import annotations

import re

from .._util import constants

GENERATED = (constants.LOCK_FILENAME, constants.CONFIG_FILENAME, constants.CARD_FILENAME)
SIGNING = (constants.SIGNATURE_FILENAME, constants.ATTESTATION_FILENAME)
#: huggingface_hub's local-dir bookkeeping folder (``_local_folder._huggingface_dir``).
HF_LOCAL_DIR = ".cache/huggingface"
#: cubepack pull's bookkeeping folder, and the origin record it writes there.
CUBEPACK_LOCAL_DIR = ".cache/cubepack"
ORIGIN_FILE = f"{CUBEPACK_LOCAL_DIR}/origin.json"
BOOKKEEPING = (HF_LOCAL_DIR, CUBEPACK_LOCAL_DIR)
#: The Hub's own file in every repo (its first commit holds it).
HUB_ATTRIBUTES = ".gitattributes"
#: Paths model_signing leaves out of a cube's signature (folders: with all they hold).
SIGNATURE_IGNORES = (constants.SIGNATURE_FILENAME, *BOOKKEEPING)
#: Top-level git paths model_signing leaves out too (its ``ignore_git_paths``, which the stock
#: CLI applies). A cube may lock them (the Hub's .gitattributes): the lock, which the signature
#: covers, then covers them.
SIGNATURE_SKIPS_GIT = (".git", ".gitattributes", ".github", ".gitignore")


#: The suffix of a ciphertext, and the private manifest (see the ciphertext role above).
CIPHER_SUFFIX = ".age"
PRIVATE_MANIFEST = "cubepack.manifest.age"
#: The folder of ciphertexts whose names hide the clear names (item ids).
HIDDEN_DIR = "private"


def is_ciphertext(name: str) -> bool:
    """Is ``name`` a ciphertext's name (an age file, the manifest included)?"""
    return name.endswith(CIPHER_SUFFIX)


def ciphertext_name(clear: str, hidden: str | None = None) -> str:
    """The name of the ciphertext of the clear file ``clear``: beside it with ``.age``, or
    ``private/<hidden>.age`` when names are hidden (``hidden``: an opaque token)."""
    return f"{HIDDEN_DIR}/{hidden}{CIPHER_SUFFIX}" if hidden else clear + CIPHER_SUFFIX


def is_activation_path(name: str) -> bool:
    """True for ``activations/<id>.kv.safetensors``: a KV file the lock must list as exactly
    one activation (only those are checked against the producer it pins)."""
    return name.startswith(constants.ACTIVATIONS_DIR + "/") and name.endswith(constants.KV_SUFFIX)


def is_bookkeeping(name: str) -> bool:
    """Is ``name`` (a relative POSIX path) a download's bookkeeping?"""
    return any(name == folder or name.startswith(folder + "/") for folder in BOOKKEEPING)


#: huggingface_hub's own files in a local dir (``hf download --local-dir``): its records of
#: downloads and uploads (with their locks and partial downloads), its tree listings, its
#: .gitignore and CACHEDIR.TAG.
_HF_RECORDS = re.compile(
    re.escape(HF_LOCAL_DIR) + r"/(?:\.gitignore(?:\.lock)?|CACHEDIR\.TAG"
    r"|(?:download|upload)/.+\.(?:metadata|lock|incomplete)|trees/[0-9a-f]{40}\.json)")


def is_hf_record(name: str) -> bool:
    """Is ``name`` (a relative POSIX path in a downloaded folder) one of the files
    huggingface_hub keeps there for its own downloads? (A pull replaces them with its own:
    losing one loses nothing.)"""
    return _HF_RECORDS.fullmatch(name) is not None


def is_tolerated(name: str) -> bool:
    """May ``name`` sit in a cube without being listed in its lock?"""
    return (name in (constants.LOCK_FILENAME, HUB_ATTRIBUTES) or name in SIGNING
            or is_bookkeeping(name))


def signature_covers(name: str) -> bool:
    """Does the signature (cubepack.sig) hash the file ``name`` itself?"""
    top = name.split("/", 1)[0]
    return not (name in SIGNATURE_IGNORES or is_bookkeeping(name)
                or top in SIGNATURE_SKIPS_GIT)


def lockable(names: list[str]) -> list[str]:
    """The files of ``names`` pack hashes into the lock as they are (not generated by pack,
    not written by signing, not bookkeeping)."""
    return [name for name in names
            if name not in GENERATED and name not in SIGNING and not is_bookkeeping(name)]


def uploaded(lock_files: list[str]) -> list[str]:
    """What a push sends of a cube whose lock lists ``lock_files``: those, the lock and the
    signing files (when present; the caller checks)."""
    return [*lock_files, constants.LOCK_FILENAME, *SIGNING]
