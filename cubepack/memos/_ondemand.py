"""The MemOS hook's load on first use (issue #40 item 2): ``init_from_remote_repo(...,
on_demand=True)`` opens a remote cube with :func:`cubepack.hub.open_cube` (its lock fetched at
one commit and checked; its signature too, under ``trusted_keys``), has it place every file but
its activation memories (``RemoteCube.place``: config.json, cubepack.yaml, text and preference
memories, adapters), verifies that folder as a full load does, each file's bytes against the
lock before anything parses them (``ops._seam.verify_fetched_later``: the memories' absence is
verify's to plan, by the partial cube's rule, and reported as fetched later), and installs an
activation memory whose items are fetched when MemOS first uses them. The hook asks and
places; it checks nothing itself.

Each first use (``KVCacheMemory.get``, ``get_by_ids``, ``get_cache``, ``get_all``, the
dictionary itself, as ``SimpleMemChat``, ``MOSCore`` and the scheduler's activation manager
read it) fetches that memory's shard index (once a shard) and its byte range at the opened
commit, and applies every check a full load applies, in the same code (the activations kind's
load, through ``ops._seam.load_verified``, handed the memory's bytes by ``LoadJob.fetch``): the
range's sha256 and its KV header's checksums against
the index (the index against the lock) before any tensor is built, the producer against the
model MemOS loaded (the mismatch policy), recomputation and provenance when asked. A failure
(offline, the network, a refusal) raises a typed error naming the memory, never an empty
memory; the memory stays absent and a later use tries again.

Why opt-in: a whole load refuses a bad memory before MemOS builds anything; on demand that
refusal moves to the first use, where MemOS's scheduler logs and swallows exceptions. A user
asks for that trade.

What a load on first use does not do: open a private cube (refused: load it whole, or pull it), or
read the attestation's statements (a producer label is then ``claimed``, so
``require_provenance`` needs ``recompute=True``), or compare the pins with the Hub's file
metadata before first use (each memory's producer is compared with the live model instead):
``strict_models`` and ``require_lineage`` are refused rather than reported as not run.

A dump (``KVCacheMemory.dump``, ``GeneralMemCube.dump``, the scheduler's) writes what the
memory holds: every memory not yet used is fetched and checked first, or the dump is refused
before anything is written; an absent memory is never written as an empty one.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from .._util.checks import Catalogue
from .._util.ramdir import ram_folder
from ..errors import FormatError, HubError, UnsupportedError, UsageError
from ..format.sections import Lock
from ..format.sections import shards as shardformat
from ..hub._open import RemoteCube, open_cube
from ..kinds import LoadJob
from ..kinds._seam import LoadedCache
from ..ops._seam import load_verified, verify_fetched_later
from ..trust._policy import TrustPolicy
from ..trust._report import VerifyReport
from ._activations import HookReport, install_loaded, item

logger = logging.getLogger("cubepack.memos")

#: Checks a load on first use cannot run before first use (they need every file): asked, they
#: are refused, never reported as not run.
_NOT_ON_DEMAND = (Catalogue.MODEL_IDENTITY, Catalogue.LINEAGE)


@contextlib.contextmanager
def opened(repo_id: str, revision: str | None, policy: TrustPolicy, *, endpoint: str | None,
           token: str | None,
           repo_type: str) -> Iterator[tuple[Path, VerifyReport, Callable, str]]:
    """``(folder, report, place, commit)``: the cube ``repo_id@revision`` opened at one
    commit, its files but its activation memories fetched into a RAM folder (gone on exit:
    MemOS holds what it loaded) and verified; ``place`` puts an on-demand activation memory
    in place of :func:`~._activations.install_loaded`.

    Raises:
        UsageError: a check asked for that cannot run before first use (``strict_models``,
            ``require_lineage``), or ``require_signature`` without ``trusted_keys``.
        SignatureError, HubError, FormatError: as :func:`open_cube`.
        UnsupportedError: a private cube.
        VerificationFailed: a file fetched is not the lock's, or the folder fails a check.
    """
    refused = [str(check) for check in _NOT_ON_DEMAND if policy.asks(check)]
    if refused:
        raise UsageError(f"{' and '.join(refused)} cannot be checked by a load on first use "
                         "(it needs the whole cube before anything is loaded); load the cube "
                         "whole (on_demand=False), or drop the option.")
    keys = list(policy.trusted())
    if policy.signature_required and not keys:
        raise UsageError("require_signature on demand needs the keys to check it against: "
                         "pass trusted_keys=[PUB.pem], or load the cube whole.")
    remote = open_cube(repo_id, revision=revision or None, repo_type=repo_type,
                       endpoint=endpoint, token=token, trusted_keys=keys or None)
    if remote.lock.private:  # its files are ciphertexts: the whole-cube load decrypts them
        raise UnsupportedError(f"{repo_id}@{remote.commit[:12]} is a private cube: a load on "
                               "first use does not open one. Load it whole (on_demand=False, "
                               "with CUBEPACK_IDENTITY or decrypt_with), or pull it: cubepack "
                               f"pull {repo_id} --revision {remote.commit} --identity KEY.")
    with ram_folder() as folder:
        remote.place(folder)  # every file but the memories: verify checks their bytes
        checked = policy.for_folder().without(Catalogue.SIGNATURE)  # open checked it
        report = verify_fetched_later(folder, checked,
                                      (remote.repo_id, remote.repo_type, remote.commit))
        report.signed_by = remote.signed_by  # its lock holds no memory: each is fetched later

        def place(act_mem: Any, loaded: tuple[Any, ...], cube_dir: Path, lock: Lock,
                  hook: HookReport) -> None:
            if not hasattr(act_mem.llm, "model"):  # vLLM prompts: fetched with the folder
                install_loaded(act_mem, loaded, cube_dir, lock, hook)
                return
            act_mem.kv_cache_memories = OnDemandMemories(act_mem, remote, hook, policy)

        yield folder, report, place, remote.commit


class OnDemandMemories(MutableMapping):
    """A ``KVCacheMemory``'s ``kv_cache_memories`` whose items are a remote cube's memories,
    each fetched and checked when first read (``[id]``, ``get``, ``values``, ``items``).
    Listing ids (``keys``, ``in``, iteration) fetches shard indexes only; ``len`` reads the
    lock, and looks up whether an id MemOS added replaces one of the cube's (a shard's index;
    offline: refused naming that id). Items MemOS adds or deletes change it as they change a
    dict; adding fetches nothing."""

    def __init__(self, act_mem: Any, remote: RemoteCube, report: HookReport,
                 policy: TrustPolicy):
        self.act_mem, self.remote, self.report, self.policy = act_mem, remote, report, policy
        self.name = f"{remote.repo_id}@{remote.commit[:12]}"
        self._held: dict[str, Any] = {}  # used (fetched and checked) or added by MemOS
        self._gone: set[str] = set()  # the remote's memories MemOS deleted (or dropped)
        self._extra: set[str] = set()  # ids MemOS added that the remote does not hold
        self._unsettled: set[str] = set()  # ids MemOS added, not looked up in the remote yet
        self._cleared = False  # every remote memory deleted (delete_all)
        self._lock = threading.RLock()

    # --- what is pending ----------------------------------------------------------------
    def _remote_entry(self, item_id: Any) -> Any:
        """The remote's entry of ``item_id`` (its shard's index fetched once), or None; a
        failure (offline, the network, an index that is not the lock's) names the memory."""
        if not isinstance(item_id, str):
            return None
        try:
            return self.remote.find(item_id)
        except (HubError, FormatError) as exc:
            raise type(exc)(f"{self._where(item_id)}, looked up on first use: {exc}") from exc

    def _where(self, item_id: str) -> str:
        return f"activation memory {item_id!r} of {self.name}"

    def held(self) -> list[Any]:
        """The items fetched or added so far (what a seal check reads: the memories still to
        fetch are a clear cube's, with no seal), fetching nothing."""
        with self._lock:
            return list(self._held.values())

    def _pending(self, item_id: Any) -> Any:
        """The remote entry of ``item_id`` when it is still to be fetched, else None."""
        if self._cleared or item_id in self._held or item_id in self._gone:
            return None
        return self._remote_entry(item_id)

    @property
    def pending(self) -> list[str]:
        """The ids of the memories not fetched yet (fetches the shard indexes)."""
        with self._lock:
            return [item for item in self._remote_ids() if item not in self._held]

    def _remote_ids(self) -> list[str]:
        if self._cleared:
            return []
        return [item for item in self.remote.ids() if item not in self._gone]

    # --- the mapping ----------------------------------------------------------------------
    def __getitem__(self, item_id: Any) -> Any:
        with self._lock:
            if item_id in self._held:
                return self._held[item_id]
            entry = self._pending(item_id)
            if entry is None:
                raise KeyError(item_id)
            item = self._load(item_id, entry)
            if item is None:  # dropped by the mismatch policy (logged, in report.dropped)
                self._gone.add(item_id)
                raise KeyError(item_id)
            self._held[item_id] = item
            return item

    def __setitem__(self, item_id: Any, item: Any) -> None:
        # MemOS adding a memory of its own is no use of the cube's: nothing is fetched here.
        # Whether the id replaces a memory of the cube (for ``len``) is settled later, by
        # :meth:`_settle`, when it can be looked up.
        with self._lock:
            self._held[item_id] = item
            self._gone.discard(item_id)
            self._unsettled.add(item_id)

    def _settle(self) -> None:
        """Look up each id MemOS added whether the cube holds it too (an addition, or a
        replacement); a lookup that fails (offline) raises naming that id, never a guess."""
        for item_id in sorted(self._unsettled, key=str):
            if self._cleared or self._remote_entry(item_id) is None:
                self._extra.add(item_id)
            self._unsettled.discard(item_id)

    def __delitem__(self, item_id: Any) -> None:
        with self._lock:
            found = self._held.pop(item_id, None) is not None
            self._extra.discard(item_id)
            self._unsettled.discard(item_id)
            if self._pending(item_id) is not None or (found and not self._cleared
                                                      and self._remote_entry(item_id)):
                self._gone.add(item_id)
                found = True
            if not found:
                raise KeyError(item_id)

    def __iter__(self) -> Iterator[str]:
        with self._lock:
            remote = self._remote_ids()
            added = [item for item in self._held if item not in set(remote)]
        return iter(remote + added)

    def __len__(self) -> int:
        with self._lock:
            self._settle()
            remote = 0 if self._cleared else self.remote.memories - len(self._gone)
            return remote + len(self._extra)

    def __contains__(self, item_id: Any) -> bool:
        with self._lock:
            return item_id in self._held or self._pending(item_id) is not None

    def items(self) -> list[tuple[str, Any]]:  # type: ignore[override]
        """Every memory fetched and checked: one the mismatch policy drops on the way leaves
        the listing (as from a dict it was never in), never a KeyError out of ``get_all``;
        any other refusal raises, naming the memory."""
        with self._lock:
            found = []
            for item_id in list(self):
                try:
                    found.append((item_id, self[item_id]))
                except KeyError:
                    if item_id not in self._gone:
                        raise
            return found

    def values(self) -> list[Any]:  # type: ignore[override]
        return [value for _, value in self.items()]

    def __reduce__(self) -> tuple[Any, ...]:
        # MemOS's own dump (after uninstall()) and deepcopy see a dict of every memory, each
        # fetched and checked first (a refusal raises, naming it): never the remote cube's
        # handle (unpicklable: a raw TypeError and a truncated pickle), never absent memories.
        return dict, (self.items(),)

    def clear(self) -> None:
        with self._lock:
            self._held.clear()
            self._extra.clear()
            self._unsettled.clear()
            self._gone.clear()
            self._cleared = True

    def __repr__(self) -> str:
        return (f"<OnDemandMemories of {self.name}: {len(self._held)} held, "
                f"{self.remote.memories} in the cube>")

    # --- a first use -------------------------------------------------------------------------
    def _load(self, item_id: str, entry: Any) -> Any:
        """The memory ``item_id`` as a KVCacheItem, checked as a whole load checks it; None if
        the mismatch policy dropped it.

        Raises:
            HubError: offline, or the endpoint failed or refused the fetch (naming the memory).
            IntegrityError, FormatError: its bytes or its index are not the lock's.
            IdentityMismatch, RecomputationFailed: as a whole load.
        """
        lock = replace(self.remote.lock, activations=MappingProxyType({item_id: entry}))
        try:
            loaded = load_verified(LoadJob(Path(self.name), lock, self.policy,
                                           {"act_mem": self.act_mem}, self.report,
                                           fetch=lambda found: self._bytes(item_id, found)))
        except BaseException:
            # A refusal leaves the report as it was: the memory was not loaded (the checks
            # record it as they pass, before the last one refuses).
            report = self.report
            report.loaded[:] = [one for one in report.loaded if one != item_id]
            for record in (report.recomputed, report.provenance, report.rebuilt):
                record.pop(item_id, None)
            raise
        caches = [one for one in loaded if isinstance(one, LoadedCache)]
        if not caches:
            return None
        logger.info("cubepack: %s fetched and checked on first use", self._where(item_id))
        return item(caches[0])

    def _bytes(self, item_id: str, entry: Any) -> Any:
        try:
            return self.remote.memory_bytes(entry)
        except (HubError, FormatError) as exc:
            raise type(exc)(f"{self._where(item_id)}, fetched on first use: {exc}") from exc
