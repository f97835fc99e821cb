"""Privacy travels with what was loaded: a private cube's memories are written private (or not
at all) by every MemOS path that writes them, as a producer travels with a cache (issue #37).

MemOS does not keep memories as the objects a load made: text and preference memories go into
a vector database (or a graph database) and a dump reads them back as new objects; an
activation memory's dump writes whatever it holds now. So the mark is kept where MemOS keeps
the memories, never on the loaded objects:

- a **memory instance** (``KVCacheMemory``, ``NaiveTextMemory``, ``GeneralTextMemory``,
  ``PreferenceTextMemory``...) that received a private cube's memories carries a
  :class:`Seal` for the rest of its life (a ``delete_all`` does not unseal it: what it holds
  next may be derived from what it held);
- a **store** a named persistent database (a Qdrant folder, a server) that received them is
  sealed for this process, so another memory instance reading the same database dumps private
  too;
- a **dump folder** that holds a private cube is written only as a whole private cube (a
  clear file is never added beside its ciphertexts).

Every hooked writer asks :func:`recipients_for` whom to encrypt to. The recipients of a
re-encryption come only from a trusted place: the manifest of a cube whose signature a trusted
key verified, or recipients the user names (``cubepack.memos.install(recipients=...)`` for every
dump, ``init_from_dir(..., recipients=...)`` for one cube's memories). An unsigned cube's
manifest is whoever pushed last's word, and must not choose who reads the user's later dumps.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._util import atomic, constants
from ..errors import SignatureError, UsageError
from ..format import _lock as lockfile
from ..format.sections import Lock
from ..trust import _age as age
from ..trust._generation import manifest_names_readers

logger = logging.getLogger("cubepack.memos")

#: The attribute a sealed memory instance (or vector database client) carries.
SEALS_ATTR = "_cubepack_seals"
#: Environment settings for servers that install the hook through ``memos.plugins``.
RECIPIENTS_ENV = "CUBEPACK_MEMOS_RECIPIENTS"
STORES_ENV = "CUBEPACK_MEMOS_STORES"
#: The cube id a sealed dump of memories from several (or unnamed) cubes is packed under.
FALLBACK_CUBE_ID = "cubepack/private-dump"


@dataclass(frozen=True)
class Seal:
    """One private cube's mark on what holds its memories.

    Attributes:
        recipients: who may read a dump of them (age / SSH recipient texts, sorted).
        trusted: the recipients come from a manifest a trusted key signed, or the user named
            them; False: from an unsigned (or untrusted) manifest, which only names who may
            read the cube itself.
        source: where the memories were loaded from (a folder, ``repo@commit``), for messages.
        cube_id: the cube's id, used for the dump's own id.
        hidden_names: the cube hid its ciphertext names; a dump of it hides them too.
        named: the user named the recipients at the load (they decide over the hook's).
    """

    recipients: tuple[str, ...]
    trusted: bool
    source: str
    cube_id: str | None = None
    hidden_names: bool = False
    #: the user named these recipients at the load (``init_from_dir(..., recipients=...)``):
    #: they decide this cube's dumps over the hook's own names
    named: bool = False

    def describe(self) -> str:
        count = len(self.recipients)
        return f"{self.source} ({count} recipient{'s' if count != 1 else ''})"


def loaded_seal(source: Any, manifest: dict[str, Any], public_lock: Lock, *,
                signed_by: str | None, named: tuple[str, ...] = ()) -> Seal:
    """The seal of a private cube just opened: its manifest's recipients, trusted only when a
    trusted key's signature covered the cube (``signed_by``: the signature covers the public
    lock, which pins the manifest's ciphertext), else the recipients the user ``named``."""
    hidden = public_lock.encryption is not None and public_lock.encryption.hidden_names
    cube_id = public_lock.cube_id
    if named:
        return Seal(tuple(sorted(named)), True, str(source), cube_id, hidden, named=True)
    return Seal(tuple(sorted(manifest["recipients"])), manifest_names_readers(signed_by),
                str(source), cube_id, hidden)


# --- marks on memory instances and stores -------------------------------------------------------

_LOCK = threading.Lock()
#: Persistent store name -> the seals of what was loaded into it (this process).
_STORE_SEALS: dict[str, frozenset[Seal]] = {}
#: Whether this process ever sealed anything: until it has, no seal can be found, and the
#: lookups that hash caches (a seal travels with a cache's content) are skipped.
_EVER = [False]


def ever_sealed() -> bool:
    return _EVER[0]


#: Called, without arguments, whenever something is sealed: the hook's module places the
#: guard that keeps a sealed memory from MemOS's own dumps when the hook is not installed (a
#: process may load a private cube with ``init_from_dir`` and never install it).
SEAL_LISTENERS: list[Callable[[], None]] = []


def note_sealed() -> None:
    _EVER[0] = True
    for listener in list(SEAL_LISTENERS):
        listener()


def forget_stores() -> None:
    """Forget which stores and that anything was sealed in this process: for a test runner,
    whose tests each stand for a fresh process (a seal is process state; in one process it
    is never forgotten, which is the point)."""
    with _LOCK:
        _STORE_SEALS.clear()
        _EVER[0] = False


def seal(target: Any, seals: Iterable[Seal]) -> None:
    """Mark ``target`` (a memory instance, a database client) with ``seals`` (added to any it
    carries), and its store, when it is a persistent one."""
    seals = frozenset(seals)
    if target is None or not seals:
        return
    note_sealed()
    with _LOCK:
        current = getattr(target, SEALS_ATTR, frozenset())
        try:
            setattr(target, SEALS_ATTR, frozenset(current) | seals)
        except AttributeError as exc:  # a __slots__ object: cannot be marked, so not loaded
            raise UsageError(f"cubepack cannot mark {type(target).__name__} as holding a private "
                             "cube's memories; refusing to load them into it.") from exc
        for part in _parts(target):
            if part is not target:
                setattr(part, SEALS_ATTR, getattr(part, SEALS_ATTR, frozenset()) | seals)
        store = instance_store(target)
        if store is not None and store.persistent:
            _STORE_SEALS[store.name] = _STORE_SEALS.get(store.name, frozenset()) | seals


def seals_of(target: Any) -> frozenset[Seal]:
    """What marks ``target``: its own seals, its database client's, and its store's."""
    if target is None:
        return frozenset()
    found = set(getattr(target, SEALS_ATTR, frozenset()))
    for part in _parts(target):
        found |= getattr(part, SEALS_ATTR, frozenset())
    store = instance_store(target)
    if store is not None and store.persistent:
        with _LOCK:
            found |= _STORE_SEALS.get(store.name, frozenset())
    return frozenset(found)


def _parts(memory: Any) -> list[Any]:
    """The objects a memory keeps its memories in (its vector / graph database client)."""
    return [part for part in (getattr(memory, "vector_db", None),
                              getattr(memory, "graph_store", None)) if part is not None]


MEMORY_KINDS = ("text_mem", "act_mem", "para_mem", "pref_mem")


def cube_memories(cube: Any) -> list[Any]:
    """The memory instances a MemOS cube holds (a ``GeneralMemCube``'s or ``NaiveMemCube``'s
    attributes, read without MemOS's warnings for absent ones)."""
    return [memory for kind in MEMORY_KINDS
            if (memory := getattr(cube, f"_{kind}", None)) is not None]


# --- stores: where a text or preference memory keeps what was loaded into it --------------------

@dataclass(frozen=True)
class Store:
    """Where a memory keeps its memories: ``name`` as the user names it to allow it
    (``qdrant:/abs/folder``, ``qdrant:http://host:6333``, ``neo4j:bolt://host``), and whether
    it persists beyond the process (a folder or a server) or lives in its memory."""

    name: str
    persistent: bool


#: Text memory backends that hold their memories in the process (MemOS's ``naive_text``: a
#: Python list).
IN_PROCESS = frozenset({"naive_text"})


#: The attribute a database client MemOS made under the hook carries: its :class:`Store`,
#: named when it was made (a relative path means the folder it opened then, whatever the
#: current folder is later).
STORE_ATTR = "_cubepack_store"


def record_store(client: Any, factory: Any, kind: str) -> Any:
    """Name the store of ``client``, just made by MemOS's ``kind`` factory (``vector_db`` or
    ``graph_db``) from its ``factory`` config, as it is now; return the client."""
    store = store_of(type("_Config", (), {kind: factory})())
    if store is not None and client is not None:
        with contextlib.suppress(AttributeError, TypeError):  # a client that takes no mark
            setattr(client, STORE_ATTR, store)
    return client


def instance_store(memory: Any) -> Store | None:
    """The store ``memory`` keeps its memories in: the one its database client was named
    with when it was made (:func:`record_store`), else the one its config names now."""
    for part in _parts(memory):
        recorded = getattr(part, STORE_ATTR, None)
        if isinstance(recorded, Store):
            return recorded
    return store_of(getattr(memory, "config", None))


def store_of(config: Any) -> Store | None:
    """The store a MemOS text or preference memory's config (its pydantic config, validated,
    so MemOS's defaults are filled in) keeps memories in; None for an activation, parametric
    or in-process memory. An unknown kind of storage is taken as persistent."""
    if config is None:
        return None
    vector_db = getattr(config, "vector_db", None)
    graph_db = getattr(config, "graph_db", None)
    if vector_db is not None:
        backend = str(getattr(vector_db, "backend", "vector_db"))
        settings = getattr(vector_db, "config", None)
        path = getattr(settings, "path", None)
        if backend == "qdrant" and path == ":memory:" and not getattr(settings, "url", None) \
                and getattr(settings, "host", None) is None:
            return Store("qdrant::memory:", persistent=False)
        return Store(f"{backend}:{_location(settings)}", persistent=True)
    if graph_db is not None:
        backend = str(getattr(graph_db, "backend", "graph_db"))
        return Store(f"{backend}:{_location(getattr(graph_db, 'config', None))}",
                     persistent=True)
    return None


def _location(settings: Any) -> str:
    """A database's location as its config names it: a URL, host:port, or an absolute path."""
    for key in ("url", "uri"):
        value = getattr(settings, key, None)
        if value:
            return str(value)
    host, port = getattr(settings, "host", None), getattr(settings, "port", None)
    if host is not None or port is not None:
        return f"{host or 'localhost'}:{port or ''}"
    path = getattr(settings, "path", None)
    if path:  # resolved: another spelling of the folder (a symlink, "..") is the same store
        return str(Path(path).expanduser().resolve())
    return "(its default location)"


def memory_store(kind: str, memory_config: Any) -> Store | None:
    """The store of the memory ``kind`` whose MemOS ``MemoryConfigFactory`` is
    ``memory_config`` (``backend`` + validated ``config``), for checks made before MemOS builds
    it. Activation and parametric memories are cubepack's own to load: None."""
    if kind not in ("text_mem", "pref_mem") or memory_config is None:
        return None
    backend = getattr(memory_config, "backend", "uninitialized")
    if backend == "uninitialized" or backend in IN_PROCESS:
        return None
    store = store_of(getattr(memory_config, "config", None))
    return store if store is not None else Store(f"{backend}:(its own storage)", True)


def refuse_persistent(stores: list[tuple[str, Store]], allowed: Iterable[str],
                      source: Any) -> None:
    """Refuse loading a private cube's memories into a persistent store the user did not name.

    Raises:
        UsageError: naming each store, what it is (kind, location) and the two ways on.
    """
    allowed = set(allowed)
    unnamed = [(kind, store) for kind, store in stores if store.persistent
               and store.name not in allowed]
    if unnamed:
        listed = ", ".join(f"{kind} into {store.name!r}" for kind, store in unnamed)
        names = ", ".join(repr(store.name) for _, store in unnamed)
        raise UsageError(
            f"{source} is a private cube, and loading it would write its memories ({listed}) "
            "into a database that persists them beyond this process, in clear: cubepack "
            "decrypts private memories to memory only. Use an in-memory store (for Qdrant: "
            "\"path\": \":memory:\" in the memory's vector_db config), or name that database "
            f"to accept it: stores=[{names}] (cubepack.memos.install, init_from_dir or "
            f"init_from_remote_repo; {STORES_ENV} for a server).")


# --- the user's settings: recipients and stores they name ---------------------------------------

@dataclass(frozen=True)
class PrivacySettings:
    """What the user names for private memories: ``recipients`` every private dump is encrypted
    to (replacing any cube's own; they also decide a dump that mixes cubes), and ``stores``,
    persistent databases a private cube's memories may be loaded into (:class:`Store` names)."""

    recipients: tuple[str, ...] = ()
    stores: tuple[str, ...] = ()

    @classmethod
    def build(cls, recipients: Any = None, stores: Any = None) -> PrivacySettings:
        """Validated at once: a recipient that does not parse is a UsageError before any work.

        Raises:
            UsageError: a recipient age cannot encrypt to, or a store that is not a string.
        """
        parsed = tuple(sorted(r.text for r in age.parse_recipients(_listed(recipients,
                                                                          "recipients")))) \
            if recipients else ()
        named = _listed(stores, "stores") if stores else []
        if not all(isinstance(store, str) and store.strip() for store in named):
            raise UsageError(f"stores must be store names such as 'qdrant:/abs/folder', not "
                             f"{stores!r}.")
        return cls(parsed, tuple(sorted(set(named))))

    @classmethod
    def from_environment(cls) -> PrivacySettings:
        """``CUBEPACK_MEMOS_RECIPIENTS`` (recipients or recipient files, joined by
        ``os.pathsep``) and ``CUBEPACK_MEMOS_STORES`` (a JSON list of store names)."""
        recipients = [r for r in os.environ.get(RECIPIENTS_ENV, "").split(os.pathsep) if r]
        text = os.environ.get(STORES_ENV, "").strip()
        try:
            stores = json.loads(text) if text else []
        except ValueError:
            raise UsageError(f"{STORES_ENV} must be a JSON list of store names, e.g. "
                             "'[\"qdrant:/srv/qdrant\"]'.") from None
        return cls.build(recipients or None, stores or None)

    def over(self, other: PrivacySettings, given: tuple[bool, bool]) -> PrivacySettings:
        """These settings where ``given`` (recipients, stores) says they were named, else
        ``other``'s (the environment's): each field on its own, as the policy's are."""
        return PrivacySettings(self.recipients if given[0] else other.recipients,
                               self.stores if given[1] else other.stores)

    def merged(self, other: PrivacySettings) -> PrivacySettings:
        """These settings and ``other``'s (a load's own names, over the hook's)."""
        return PrivacySettings(self.recipients or other.recipients,
                               tuple(sorted(set(self.stores) | set(other.stores))))


#: The settings the installed hook was given (None: not installed); set by ``install``.
_INSTALLED: list[PrivacySettings | None] = [None]


def installed_settings() -> PrivacySettings | None:
    return _INSTALLED[0]


def set_installed(settings: PrivacySettings | None) -> None:
    _INSTALLED[0] = settings


def in_force() -> PrivacySettings:
    """The recipients and stores the installed hook was given (empty when not installed)."""
    return _INSTALLED[0] or PrivacySettings()


def _listed(value: Any, name: str) -> list[Any]:
    if isinstance(value, (str, os.PathLike)):
        return [os.fspath(value)]
    if isinstance(value, (list, tuple, set, frozenset)):
        return [os.fspath(v) if isinstance(v, os.PathLike) else v for v in value]
    raise UsageError(f"{name} must be a list of strings, not {value!r}.")


def recipients_for(seals: frozenset[Seal], named: tuple[str, ...], writer: str,
                   target: Any) -> tuple[list[str], bool]:
    """(the recipients, hide names) of a dump of memories marked ``seals`` by ``writer``
    (``KVCacheMemory.dump``...) to ``target``: the ones the user named for these cubes at
    their load (when they all were, the same), else the ones the hook was given (``named``),
    else the one set of recipients every seal trusts.

    Raises:
        UsageError: the memories come from cubes with different recipients, and none were
            named.
        SignatureError: the recipients come from a manifest no trusted key signed.
    """
    hidden = any(s.hidden_names for s in seals)
    own = {s.recipients for s in seals if s.named}
    if own and all(s.named for s in seals) and len(own) == 1:
        # The readers the user named for these very cubes at their load: more particular than
        # the hook's names for every dump, so they decide (a cube named to alice alone is
        # never dumped to whoever else the hook names).
        return list(next(iter(own))), hidden
    if named:
        return list(named), hidden
    sets = sorted({s.recipients for s in seals})
    if len(sets) > 1:
        cubes = "; ".join(sorted(s.describe() for s in seals))
        raise UsageError(
            f"{writer} to {target} would write memories of private cubes with different "
            f"recipients ({cubes}) into one dump, which has one set of readers. Name them: "
            "cubepack.memos.install(recipients=[...]) (or "
            f"{RECIPIENTS_ENV}); or dump each cube's memories from a memory of their own. "
            "Nothing was written.")
    untrusted = sorted(s.source for s in seals if not s.trusted)
    if untrusted:
        raise SignatureError(
            f"{writer} to {target} would encrypt a private cube's memories to the recipients "
            f"its manifest lists ({', '.join(untrusted)}), but no trusted key signed that "
            "manifest: whoever pushed the cube last chose them. Name the readers of your dumps "
            f"(cubepack.memos.install(recipients=[...]), {RECIPIENTS_ENV}, or "
            "init_from_dir/init_from_remote_repo(..., recipients=[...])), or load the cube "
            "with trusted_keys=[...] so its signed manifest says who reads it. Nothing was "
            "written.")
    return list(sets[0]), hidden


def dump_cube_id(seals: frozenset[Seal]) -> str:
    """The id a sealed dump is packed under: its cube's, when every seal names the same one."""
    ids = {s.cube_id for s in seals}
    if len(ids) == 1:
        (only,) = ids
        if only is not None:
            try:
                return lockfile.check_cube_id(only)
            except UsageError:
                pass
    return FALLBACK_CUBE_ID


# --- dump folders -------------------------------------------------------------------------------

#: The RAM folders a sealed dump writes its clear files into (this context only): the hooked
#: memory dumps MemOS calls there write plainly, the folder is encrypted whole afterwards.
_CLEAR_INTO: contextvars.ContextVar[tuple[Path, ...]] = contextvars.ContextVar(
    "cubepack_memos_clear_into", default=())


@contextlib.contextmanager
def writing_clear(folder: Path) -> Iterator[None]:
    token = _CLEAR_INTO.set((*_CLEAR_INTO.get(), Path(folder).resolve()))
    try:
        yield
    finally:
        _CLEAR_INTO.reset(token)


def clear_allowed(target: Any) -> bool:
    """Is ``target`` inside the RAM folder of a sealed dump in progress?"""
    resolved = Path(target).resolve()
    return any(resolved == root or root in resolved.parents for root in _CLEAR_INTO.get())


def private_folder(target: Path) -> bool:
    """Does ``target`` hold a private cube (a lock with an encryption section)?"""
    lock = target / constants.LOCK_FILENAME
    if not lock.is_file() or lock.is_symlink():
        return False
    try:
        return lockfile.parse(lock.read_bytes()).private
    except Exception:  # noqa: BLE001 - a damaged lock is not one cubepack may replace
        return False


def _record_path(target: Path) -> Path:
    digest = hashlib.sha256(str(target.resolve()).encode("utf-8")).hexdigest()
    return constants.cache_dir() / "dumps" / f"{digest}.json"


def _lock_digest(target: Path) -> str | None:
    lock = target / constants.LOCK_FILENAME
    if lock.is_symlink() or not lock.is_file():
        return None
    return hashlib.sha256(lock.read_bytes()).hexdigest()


def own_dump(target: Path, writer: str) -> bool:
    """Is ``target`` exactly the private dump this user's ``writer`` last wrote there (the
    record it left in cubepack's cache names the folder, the writer and its lock's sha256)?
    Only such a folder is replaced by the next dump: never another cube, another memory's
    dump, or one changed since."""
    record_path = _record_path(target)
    try:
        if record_path.is_symlink() or record_path.stat().st_uid != os.getuid():
            return False
        record = json.loads(record_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (isinstance(record, dict) and record.get("path") == str(target.resolve())
            and record.get("writer") == writer and private_folder(target)
            and record.get("lock_sha256") == _lock_digest(target))


def remember_dump(target: Path, writer: str) -> None:
    """Record, in cubepack's cache, the private dump ``writer`` just placed at ``target`` (so
    its next dump may replace it); a cache that cannot be written costs only that."""
    try:
        atomic.write_text(_record_path(target), json.dumps(
            {"path": str(target.resolve()), "writer": writer,
             "lock_sha256": _lock_digest(target)}))
    except OSError as exc:
        logger.warning("cubepack: could not record the private dump at %s in %s (%s): its "
                       "next dump there will be refused; dump to an empty folder instead",
                       target, constants.cache_dir(), exc)


def check_dump_target(target: Path, writer: str) -> None:
    """A sealed dump writes a whole private cube: into a folder that is absent or empty, or
    that holds exactly the private dump this user's same writer made there last
    (:func:`own_dump`, replaced whole); never beside other files, never over another cube.

    Raises:
        UsageError: naming the folder and what it holds.
    """
    for parent in [target, *target.parents]:
        if parent.exists() or parent.is_symlink():
            if parent != target and not parent.is_dir():
                raise UsageError(f"{writer} to {target}: {parent} is not a folder, so nothing "
                                 "can be dumped under it. Dump to a folder. Nothing was "
                                 "written.")
            break
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise UsageError(f"{writer}: {target} is not a folder; a private memory is dumped as a "
                         "private cube folder. Nothing was written.")
    if not target.exists() or not any(target.iterdir()) or own_dump(target, writer):
        return
    if private_folder(target):
        raise UsageError(
            f"{writer} of a private cube's memories writes a whole private cube, and {target} "
            f"holds another private cube (not the dump this user's {writer} wrote there last: "
            "another cube, another memory's dump, or one changed since), which it would "
            "destroy. Dump to an empty folder (or GeneralMemCube.dump the whole cube). "
            "Nothing was written.")
    held = sorted(p.name for p in target.iterdir())
    raise UsageError(
        f"{writer} of a private cube's memories writes a whole private cube, and {target} "
        f"holds other files ({', '.join(held[:5])}{', ...' if len(held) > 5 else ''}): its "
        "ciphertexts never sit beside clear files. Dump to an empty folder. Nothing was "
        "written.")


def refuse_clear_into_private(target: Path, writer: str) -> None:
    """A memory that is not private writes nothing into a private cube's folder: its clear
    files would sit beside the ciphertexts (and, once packed, be published with them).

    Raises:
        UsageError: naming the folder.
    """
    if target.is_dir() and private_folder(target):
        raise UsageError(
            f"{writer}: {target} holds a private cube, and this memory is not private, so its "
            "dump would add clear files beside the ciphertexts. Dump it to another folder. "
            "Nothing was written.")
