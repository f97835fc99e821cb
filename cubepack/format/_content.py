"""What a packed cube may hold: the one rule ``pack`` and ``verify`` both apply.

Every file is accepted only after a strict parser for its kind has read it: JSON (strict,
UTF-8), YAML (strict safe load), safetensors (the full header validation; KV files also their
structure), UTF-8 text, DSSE attestations (exact envelope and statement layout). Anything else is refused, naming the file and its kind. No kind may hold
a pickle, whatever its name: the protocol header, a pickle-format suffix, a ``torch.save`` zip,
and a complete pickle opcode stream (protocols 0 and 1 have no header and are plain ASCII) are
each refused. ``pack`` refuses to write a cube that ``verify`` would refuse, so every cube
cubepack writes verifies.
"""

from __future__ import annotations

import mmap
import os
import pickle
import zipfile
from pathlib import Path, PurePosixPath
from typing import Any

from .._util import canonical, constants
from .._util.safetensors_header import read_header
from ..errors import CubepackError, FormatError, RefusedError, UnsafeInputError
from ..kv._format import read_kv_header
from . import _fileset as fileset
from ._envelope import check_file as check_attestation_file
from ._fileset import is_activation_path
from .sections import shards

#: File suffixes of pickle-based formats (torch.save checkpoints are zips of pickles).
PICKLE_SUFFIXES = (".pickle", ".pkl", ".pt", ".pth", ".bin", ".ckpt", ".joblib", ".npy", ".npz")
JSON_NAMES = (constants.LOCK_FILENAME, constants.SIGNATURE_FILENAME)
#: DSSE envelopes (a cube's own, its ancestors'): read by the strict envelope parser.
ATTESTATION_NAMES = (constants.ATTESTATION_FILENAME, constants.ANCESTORS_FILENAME)
TEXT_NAMES = (".gitattributes", ".gitignore")
TEXT_SUFFIXES = (".md", ".txt", ".jinja", ".adapter", ".metadata")
#: The largest text file a cube may hold (read whole to check it is UTF-8 with no NUL).
MAX_TEXT_BYTES = 64 * 1024 * 1024


def file_kind(name: str) -> str | None:
    """The kind of a cube file by its name: json, jsonl, yaml, kv, safetensors, text; None
    if none."""
    base = PurePosixPath(name).name
    lower = base.lower()
    if name.startswith(fileset.HF_LOCAL_DIR + "/"):
        return "text"  # hf download's bookkeeping: .gitignore, *.metadata, empty *.lock files
    if name in ATTESTATION_NAMES:
        return "attestation"
    if fileset.is_ciphertext(name):
        return "age"
    if base in JSON_NAMES or lower.endswith(".json"):
        return "json"
    if lower.endswith(".jsonl"):
        return "jsonl"
    if lower.endswith((".yaml", ".yml")):
        return "yaml"
    if is_activation_path(name):
        return "kv"
    if shards.is_shard_path(name):
        return "kvshard"
    if lower.endswith(".safetensors"):
        return "safetensors"
    if base in TEXT_NAMES or lower.endswith(TEXT_SUFFIXES):
        return "text"
    return None


def file_problem(path: Path, name: str) -> str | None:
    """Why the file ``name`` (at ``path``) may not ship in a cube, or None when it may."""
    error = content_error(path, name)
    return str(error) if error is not None else None


def content_error(path: Path, name: str) -> RefusedError | None:
    """:func:`file_problem` as the error ``pack`` raises: :class:`UnsafeInputError` for a pickle
    or a kind no cube may hold, :class:`FormatError` for a file its kind's parser refuses
    (malformed, or beyond a limit such as the nesting depth)."""
    pickled = pickle_evidence(path, name)
    if pickled:
        return UnsafeInputError(pickled)
    kind = file_kind(name)
    if kind is None:
        return UnsafeInputError(
            f"is of no kind a cube may hold (suffix {PurePosixPath(name).suffix or 'none'!r}); "
            "cubes hold JSON, JSON Lines, YAML, safetensors and UTF-8 text (.md, .txt, .jinja) "
            "only")
    try:
        if kind == "attestation":
            check_attestation_file(path, name)
        else:
            _CHECKS[kind](path)
    except (CubepackError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        return FormatError(f"is not valid {kind}: {exc}")
    return None


def pickle_evidence(path: Path, name: str) -> str | None:
    """Why the file at ``path`` is (or holds) a pickle, or None."""
    if name.lower().endswith(PICKLE_SUFFIXES):
        return f"has a pickle-format suffix ({Path(name).suffix}); cubes must not carry pickles"
    # Unbuffered: a buffered reader reads a whole block ahead (a small KV file's tensors too)
    # into a heap buffer that outlives the read, and a private cube's plaintext is checked here.
    with open(path, "rb", buffering=0) as handle:
        head = handle.read(4)
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return "starts with a pickle protocol header; cubes must not carry pickles"
    if head == b"PK\x03\x04":
        try:
            with zipfile.ZipFile(path) as archive:
                if any(entry.endswith((".pkl", ".pickle")) for entry in archive.namelist()):
                    return ("is a zip archive holding a pickle (torch.save format); cubes must "
                            "not carry pickles")
        except (zipfile.BadZipFile, OSError, ValueError):
            pass
        return "is a zip archive; cubes must not carry archives"
    if path.stat().st_size <= MAX_TEXT_BYTES and is_pickle_file(path):
        return "is a pickle opcode stream (protocol 0/1, no header); cubes must not carry pickles"
    return None


def is_pickle_file(path: Path) -> bool:
    """True when ``pickle.load`` would read the file at ``path`` to the end of a pickle (STOP).
    Decided by CPython's own unpickler run dry: every global it asks for is an inert stand-in
    that records nothing and calls nothing, so no code runs, and the loader's own leniency
    (``I0x1``, which ``pickletools`` rejects but ``pickle.load`` accepts) is the rule, not a
    guess at it. It reads from the file as it goes: a file that is no pickle fails within its
    first bytes, so a large tensor file is not read whole (bench/pull.py). Read through a
    read-only map of the file (mmap has the ``read``/``readline`` the unpickler takes): a
    buffered reader would prefetch up to 128 KiB into a heap buffer that outlives the check,
    and a private cube's plaintext is checked here."""
    with open(path, "rb", buffering=0) as handle:
        if os.fstat(handle.fileno()).st_size == 0:
            return False  # there is no empty map; an empty file is no pickle either
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            try:
                _DryUnpickler(mapped).load()
            except Exception:  # noqa: BLE001 - pickle.load would fail too: not a pickle
                return False
    return True


class _Inert:
    """What a dry unpickle builds for any global: accepts every call, attribute and state."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> _Inert:
        return _Inert()

    def __setstate__(self, state: Any) -> None:
        pass

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def append(self, value: Any) -> None:
        pass

    def extend(self, values: Any) -> None:
        pass


class _DryUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        return _Inert

    def persistent_load(self, pid: Any) -> Any:
        return _Inert()


def _check_json(path: Path) -> None:
    canonical.loads_strict(path.read_bytes())


def _check_jsonl(path: Path) -> None:
    """JSON Lines (prompts, a corpus): every non-blank line one strict JSON document."""
    _check_text(path)
    for number, line in enumerate(path.read_bytes().decode("utf-8").splitlines(), 1):
        if line.strip():
            try:
                canonical.loads_strict(line)
            except ValueError as exc:
                raise ValueError(f"line {number}: {exc}") from None


def _check_yaml(path: Path) -> None:
    canonical.load_yaml_strict(path.read_bytes().decode("utf-8"))


def _check_kv(path: Path) -> None:
    read_kv_header(path)


def _check_kvshard(path: Path) -> None:
    """A shard (``format/sections/shards.py``): KV files end to end, each at the alignment
    boundary after the one before, zeros between them, each read by the KV reader; the
    index's ranges are checked against this same layout."""
    size = path.stat().st_size
    if size == 0:
        raise ValueError("a shard holds at least one memory")
    with open(path, "rb") as handle, \
            mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        view = memoryview(mapped)
        try:
            at = 0
            while at < size:
                length = _safetensors_length(view, at, size)
                read_kv_header(f"{path} at byte {at}", data=view[at:at + length])
                end = at + length
                at = min(shards.aligned(end), size)
                if any(view[end:at]):
                    raise ValueError(f"bytes {end} to {at} are not the zero padding")
        finally:
            view.release()


def _safetensors_length(view: memoryview, at: int, size: int) -> int:
    """The length of the safetensors file starting at ``at`` (its header's, read strictly):
    8 bytes, the header, its tensors' data to the largest end offset."""
    if at + 8 > size:
        raise ValueError(f"byte {at}: {size - at} bytes left, no safetensors header")
    length = int.from_bytes(view[at:at + 8], "little")
    if length > 100 * 1024 * 1024 or at + 8 + length > size:
        raise ValueError(f"byte {at}: a header of {length} bytes does not fit the shard")
    header = canonical.loads_strict(bytes(view[at + 8:at + 8 + length]),
                                    object_pairs_hook=canonical.unique_pairs)
    ends = [entry.get("data_offsets", [0, 0])[1] for key, entry in header.items()
            if key != "__metadata__" and isinstance(entry, dict)]
    if not all(type(end) is int and end >= 0 for end in ends):
        raise ValueError(f"byte {at}: malformed data offsets")
    return 8 + length + max(ends, default=0)


def _check_safetensors(path: Path) -> None:
    read_header(path)


#: The first line of every age file (its format's version line): a private cube's ciphertexts.
AGE_MAGIC = b"age-encryption.org/v1\n"


def _check_age(path: Path) -> None:
    """A ciphertext as a private cube holds it: an age v1 header (version line, recipient
    stanzas, the MAC line), read without any key; the payload is age's to authenticate."""
    with open(path, "rb") as handle:
        head = handle.read(64 * 1024)
    if not head.startswith(AGE_MAGIC):
        raise ValueError("no 'age-encryption.org/v1' version line")
    end = head.find(b"\n---")
    if end < 0 or b"\n-> " not in head[:end + 1]:
        raise ValueError("no complete age header (recipient stanzas, then the '---' MAC line) "
                         "in its first 64 KiB")


def _check_text(path: Path) -> None:
    size = path.stat().st_size
    if size > MAX_TEXT_BYTES:
        raise ValueError(f"it is {size:,} bytes, over the {MAX_TEXT_BYTES // 2**20} MiB a text "
                         "file may hold")
    text = path.read_bytes().decode("utf-8")
    if "\x00" in text:
        raise ValueError("it holds NUL bytes")


_CHECKS = {"json": _check_json, "jsonl": _check_jsonl, "yaml": _check_yaml, "kv": _check_kv,
           "kvshard": _check_kvshard,
           "safetensors": _check_safetensors, "text": _check_text, "age": _check_age}
