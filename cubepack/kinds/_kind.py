"""The one declared interface of a memory kind, and the jobs its phases are handed.

A memory kind (activations, adapters, a text memory's vectors...) owns everything about its
memories: how they are pinned, staged and proved by ``pack``; checked by ``verify``, first
their bytes, then their proofs; carried over by ``migrate`` and ``upgrade``; counted by a
private cube's public lock; loaded into a live model. The verbs in ``ops/`` own only the
ORDER of those phases, the same for every kind, and iterate :data:`cubepack.kinds.KINDS`:

=================  ==================  ====================================================
verb               phase               runs
=================  ==================  ====================================================
pack               ``refuse``          before anything is read but the file list
pack               ``pin``             before staging: pins the models the kind needs
pack               ``stage``           in the staging folder, after the copy: conversions
pack               ``prove``           ``pack --recompute`` only, after every ``stage``
pack               ``memories``        its files, listed in ``cubepack.yaml``
pack               ``entries``         after hashing: the kind's lock section
pack               ``store``           after every ``entries``: the files as stored (shards)
pack               ``settings``        what a later pack keeps, in ``cubepack.yaml``
pack               ``finish``          the lock written: the kind's fields of the result
verify             ``check_bytes``     files hashed; BEFORE trust (only intact files parsed)
verify             ``model_note``      a pinned model failed: say whose pin it is
verify             ``check_base``      a pinned model matched: does it fit the kind's entries
verify             ``check_proofs``    AFTER trust, clear cubes: recompute, provenance...
sign               ``established``     what a passed verification proved of the kind's items
migrate            ``rewrites``        before the copy: the files the kind writes anew
migrate            ``migrate``         in the staging folder, before pack locks it
upgrade            ``upgradable``      which of the kind's files upgrade looks at (outdated?)
upgrade            ``upgrade``         rewrites one such file (staged, or a lone file)
encrypt            ``counts``          what a private cube's public lock counts
encrypt            ``files``           which clear files hold the kind's memories
(its load verb)    ``load``            after the policy is honoured and the cube verified
(the MemOS hook)   ``check_memos_``    before MemOS builds anything: what its config decides
                   ``config``
(the MemOS hook)   ``load_memos``      the cube verified (and decrypted): every check of the
                                       kind's memories for the live MemOS memory, its
                                       memories placed or handed back to the hook to place
=================  ==================  ====================================================

Every phase has a do-nothing default here, so a kind implements the phases it needs and
inherits the rest (``class MyKind(Kind)``). Each phase is handed a job (:class:`PackJob`,
:class:`MigrateJob`): the verb's inputs and what earlier phases made, never a long list of
parameters. What a kind keeps between its own phases it keeps in ``job.state[kind.name]``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from .._util.options import Options
from ..errors import UnsupportedError, UsageError
from ..format import _lock as lockfile

if TYPE_CHECKING:  # types only: the phases' arguments
    from ..format.sections import Lock, Pin
    from ..trust._policy import TrustPolicy
    from ..trust._report import VerifyReport


@dataclass(frozen=True)
class PackOptions(Options):
    """What ``pack`` is asked to do beyond packing the folder as it is (``cubepack.pack``'s
    keyword arguments; see its docstring for each)."""

    VERB: ClassVar[str] = "pack"

    model: Any = None
    revision: str | None = None
    legacy_pickle: bool = False
    license: str | None = None
    pretty_name: str | None = None
    progress: bool | None = None
    sign_key: str | Path | None = None
    sign_password: str | None = None
    assert_producer: bool = False
    recompute: bool = False
    embedder: str | None = None
    cube_id: str | None = None
    adapter_base: Any = None
    #: store the activation memories many to a file (True), one a file (False), or decide
    #: by their count (None: ``kinds/activations/_shards.py``)
    shards: bool | None = None
    #: a shard's bound in bytes (implies ``shards``; None: the format's default, 2 GiB)
    shard_size: int | None = None
    #: ids of sharded memories to drop (``--remove``; with a new file of the same id: replace)
    remove: tuple[str, ...] = ()
    #: rewrite the shards whose dead share passes this bound (``cubepack compact``); None:
    #: keep every shard that still holds a memory
    compact: float | None = None
    #: for ``migrate`` only: ``{"lineage": section, "provenance": {file: label}}``
    derived: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class MigrateOptions(Options):
    """What ``migrate`` builds (``cubepack.migrate``'s keyword arguments; see its docstring):
    where, for which new model and/or embedder, signed how. A name a trust policy has too
    (``model``, ``embedder``) is migrate's: the old cube's policy goes in ``policy``."""

    VERB: ClassVar[str] = "migrate"

    out: str | Path | None = None
    model: Any = None
    revision: str | None = None
    embedder: str | None = None
    progress: bool | None = None
    sign_key: str | Path | None = None
    sign_password: str | None = None

    def check(self) -> None:
        """Refuse a migrate that names nothing to migrate to, or nowhere to put it.

        Raises:
            UsageError: no ``out``; neither ``model`` nor ``embedder``; ``revision`` alone.
        """
        if self.out is None:
            raise UsageError("migrate needs out=, where the new cube goes (--out).")
        if self.model is None and self.embedder is None:
            raise UsageError("migrate needs a new model, a new embedder or both: pass "
                             "--model M and/or --embedder E.")
        if self.revision is not None and self.model is None:
            raise UsageError("--revision picks a revision of --model; pass --model too.")

    def packing(self, **fields: Any) -> PackOptions:
        """How ``pack`` locks the cube migrate built: for the new model and embedder, signed
        as asked, with ``fields`` (its cube id, the lineage and labels migrate derived)."""
        return PackOptions.build(model=self.model, revision=self.revision,
                                 embedder=self.embedder, progress=self.progress,
                                 sign_key=self.sign_key, sign_password=self.sign_password,
                                 **fields)


@dataclass(frozen=True)
class PackJob:
    """One ``pack`` of one folder: its inputs, and what the phases make (the pins, the labels
    established, each kind's own state). Frozen: its fields are not reassigned, the mappings
    in them are filled by the phases."""

    #: the folder being packed (read only: everything is written in a staging folder)
    cube: Path
    #: its files (relative POSIX paths), as listed before anything was read
    files: list[str]
    options: PackOptions
    #: MemOS's config.json (or ``{"cube_id": ...}`` for a folder without one)
    config: dict[str, Any]
    #: the cube's last lock, when it has a readable one (what a re-pack keeps)
    earlier: Lock | None
    #: the pack settings its last pack recorded (``cubepack.yaml``'s ``pack``: each kind
    #: reads and checks its own, :meth:`Kind.settings`), kept unless an option overrides one
    settings: Mapping[str, Any] = field(default_factory=dict)
    #: role -> the pin this pack makes (as the lock will hold it); kinds add theirs in ``pin``
    pins: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: file -> the provenance label this pack established for it (a conversion, a proof)
    proven: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: sha256 -> the provenance record the cube's last lock gave a memory of those bytes,
    #: kept by ``compact`` (it re-lays out memories and changes none): the lock's claim carried
    #: as it was, never one this pack established (``--sign-key`` signs it as a claim)
    carried: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: files of the cube a kind writes anew in ``stage`` instead of having them copied
    replaced: set[str] = field(default_factory=set)
    #: roles pinned from a Hub's file metadata: the Hub's claim, never signed as proved
    claimed_roles: set[str] = field(default_factory=set)
    #: kind name -> what the kind keeps between its phases
    state: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class LoadJob:
    """One load of a verified cube's memories into live MemOS memories (the MemOS hook's):
    what every kind's ``load_memos`` is handed. The hook decided trust and opened a private
    cube before this; the kinds run every check of their memories against the live models
    here, and the hook keeps none."""

    #: the verified cube folder (a private cube's clear files, in a RAM folder)
    cube: Path
    #: the lock that verification read
    lock: Lock
    policy: TrustPolicy
    #: MemOS memory name (``act_mem``, ``pref_mem``...) -> the live memory to load into, for
    #: the memories this load fills (a name absent: not loaded here)
    memories: Mapping[str, Any]
    #: the hook's report (``cubepack.memos.HookReport``): a kind records there what it loaded,
    #: dropped, rebuilt, recomputed and what backs each label
    report: Any
    #: the MemOS config the memories were built from, as JSON ({}: none)
    config: Mapping[str, Any] = field(default_factory=dict)
    #: the private cubes the memories come from: every memory loaded carries them
    seals: frozenset[Any] = frozenset()
    #: the whole cube is loaded (``init_from_dir``...): a kind whose memory is not asked
    #: still refuses what the policy refuses of the cube (a required provenance)
    whole: bool = False
    #: False: MemOS has built nothing yet (``memories`` is empty, or holds memories not yet
    #: loaded): only the kinds' ``check_memos_config`` runs, on ``config``; True: MemOS built
    #: the memories and loaded what it loads itself: the kinds' ``load_memos`` runs
    built: bool = True
    #: a memory's bytes, checked against its lock or index entry, for a load whose memories
    #: are not in ``cube`` (a remote cube's, fetched on first use: ``memos/_ondemand.py``)
    fetch: Callable[[Any], Any] | None = None

    def memory(self, kind: Kind) -> Any:
        """The live MemOS memory ``kind`` loads into in this load, or None."""
        return self.memories.get(kind.memos_memory) if kind.memos_memory else None


@dataclass(frozen=True)
class MigrateJob:
    """One ``migrate`` of a verified cube into a staging folder: its inputs, and what the
    kinds record for the lineage, the result and ``pack``."""

    cube: Path
    staging: Path
    lock: Lock
    #: the old cube's config.json, or None; the kinds edit the copy the new cube gets
    config: dict[str, Any] | None
    #: the new producer model (folder, Hub id or loaded model), or None
    model: Any
    revision: str | None
    #: the new embedder spec, or None
    embedder: str | None
    progress: bool | None
    #: what the new cube's lineage section states changed: key -> value, each key declared
    #: by a lock section (``format.sections.lineage.register_change``; the rest: defaults)
    lineage: dict[str, Any] = field(default_factory=dict)
    #: the result's fields (``MigrateResult``'s keywords)
    result: dict[str, Any] = field(default_factory=dict)
    #: file -> the provenance label the migrate established (handed to ``pack``)
    proven: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: kind name -> what the kind keeps between its phases
    state: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, cube: Path, staging: Path, lock: Lock, config: dict[str, Any] | None,
           options: MigrateOptions) -> MigrateJob:
        """The job of a migrate of ``cube`` asked as ``options``."""
        return cls(cube, staging, lock, config, options.model, options.revision,
                   options.embedder, options.progress)


def made_pin(pins: dict[str, dict[str, Any]], role: str) -> Pin | None:
    """The pin a pack made for ``role`` (``pins``: as it will write them), as the frozen value
    a reader of its lock would get; None when it made none."""
    return lockfile.typed_pin(role, pins[role]) if role in pins else None


class Kind(Protocol):
    """A memory kind: its name, its lock section, and its phases (the module docstring's
    table). Subclass it (``class Adapters(Kind)``) to inherit the defaults, which do
    nothing."""

    #: the kind's name, its folder under ``cubepack/kinds/``
    name: ClassVar[str]
    #: the lock section holding its entries (``format/sections/<section>.py``), or None when
    #: its record lives in another section (a text memory's vectors: the embedder's pin)
    section: ClassVar[str | None] = None
    #: the key its files are listed under in ``cubepack.yaml``'s ``memories`` (and a
    #: private cube's public config), or None
    memory: ClassVar[str | None] = None
    #: does ``cubepack.yaml`` state its section's entries (``format._cubeconfig``'s view)?
    in_config: ClassVar[bool] = False
    #: the public load verb this kind serves (``load_kv_cache``, ``load_adapter``), or None
    serves: ClassVar[str | None] = None
    #: how a private cube's card and report name the memories its ``counts`` count
    #: (``"KV caches"``), or None to leave them unnamed
    noun: ClassVar[str | None] = None
    #: the MemOS memory its memories load into (``GeneralMemCube``'s attribute, ``act_mem``),
    #: or None when MemOS holds none of them
    memos_memory: ClassVar[str | None] = None
    #: the MemOS memory classes whose own ``load`` the kind replaces when a cube holds its
    #: memories (``PreferenceTextMemory``: MemOS's own load of a dump loads nothing)
    memos_classes: ClassVar[tuple[str, ...]] = ()

    # --- pack ----------------------------------------------------------------------------

    def refuse(self, cube: Path, files: list[str], options: PackOptions) -> None:
        """Refuse options the folder cannot use, before anything in it is read.

        Raises:
            UsageError: e.g. a base named for adapters the folder does not hold.
        """

    def pin(self, job: PackJob) -> None:
        """Pin the models the kind's memories need (``job.pins``), check what must hold
        before staging, and say which files ``stage`` writes anew (``job.replaced``). Runs in
        the registry's order: a later kind sees the pins of an earlier one."""

    def stage(self, job: PackJob, staging: Path) -> list[str]:
        """Convert what the kind converts into ``staging`` (the cube's other files are
        copied there already), recording the labels it established (``job.proven``). Returns
        the files it converted (``PackResult.converted``)."""
        return []

    def prove(self, job: PackJob, staging: Path) -> dict[str, dict[str, Any]]:
        """``pack --recompute``: prove every memory of the kind by recomputing it, rewriting
        each with the proof; file -> the label established (added to ``job.proven``)."""
        return {}

    def memories(self, job: PackJob, content: list[str]) -> list[str]:
        """The files of ``content`` (the staged cube's lockable files) holding the kind's
        memories, listed under :attr:`memory` in ``cubepack.yaml`` (in place of what
        MemOS's config.json lists there: ``memos_format``'s ``memory_files`` gives that)."""
        return []

    def entries(self, job: PackJob, staging: Path, digests: dict[str, str],
                pins: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """The kind's lock section (entry name -> entry, as the lock's JSON), from the staged
        files and their ``digests``; ``pins``: as the lock will hold them. Reads only files
        this pack hashed; refuses what must not be sealed."""
        return {}

    def store(self, job: PackJob, staging: Path,
              sections: dict[str, Any]) -> dict[str, Any]:
        """After ``entries``: lay the kind's files out as the cube stores them (activations:
        many to a shard, :mod:`cubepack.kinds.activations._shards`), rewriting ``staging``;
        the lock sections that replace or join ``sections`` ({}: stored as staged)."""
        return {}

    def settings(self, job: PackJob, sections: dict[str, Any]) -> dict[str, Any]:
        """After ``store``: the settings of this pack the kind's next pack keeps (recorded in
        ``cubepack.yaml``'s ``pack``, handed back in ``job.settings``; ``sections``: the lock
        sections as stored). {}: none."""
        return {}

    def finish(self, job: PackJob, staging: Path, written: Lock, result: Any) -> None:
        """The lock is written: set the kind's fields of ``result`` (a ``PackResult``)."""

    # --- verify ----------------------------------------------------------------------------

    def check_bytes(self, report: VerifyReport, lock: Lock, intact: set[str]) -> None:
        """BEFORE trust: the kind's files against the lock, headers and structure only, with
        no model. Only files in ``intact`` (their size and sha256 the lock's) are parsed: a
        file whose bytes are not the lock's is never read further."""

    def prove_indexed(self, cube: Path, indexes: list[Any]) -> dict[str, Any]:
        """Prove every byte of the files of ``indexes`` (indexes kept outside the lock, each
        checked against it) the kind owns, by hashing each memory's range once against its
        index; returns a proof per file (``error``; ``headers``: what was parsed of the bytes
        hashed, handed back to ``check_bytes`` through the report). Default: none owned."""
        return {}

    def model_note(self, role: str) -> str:
        """Words added to a model-identity failure of the pin ``role`` when the kind owns it
        (``" (the base this adapter was packed for)"``); "" otherwise."""
        return ""

    def check_base(self, report: VerifyReport, lock: Lock, role: str, base: Any) -> None:
        """The model pinned to ``role`` matched its pin (``base``: its folder, or the loaded
        model): check it fits the kind's entries pinned to that role."""

    def check_proofs(self, report: VerifyReport, lock: Lock, policy: TrustPolicy) -> None:
        """AFTER trust, on a clear cube whose files are intact and pins checked: the proofs
        ``policy`` asks of the kind (recomputation, provenance, re-embedding); record what
        backs each memory's label (``report.provenance``)."""

    # --- sign ------------------------------------------------------------------------------

    def established(self, report: VerifyReport) -> frozenset[str]:
        """The items whose lock labels a passed verification (``report``) proved, which a
        signer may state as proved."""
        return frozenset()

    # --- migrate ---------------------------------------------------------------------------

    def rewrites(self, job: MigrateJob) -> set[str]:
        """Files of the old cube the kind writes anew (or leaves out) in the new one; the
        rest are copied."""
        return set()

    def migrate(self, job: MigrateJob) -> None:
        """Write the kind's memories for the new model or embedder into ``job.staging``,
        edit ``job.config``, and record ``job.lineage``, ``job.result`` and ``job.proven``."""

    # --- upgrade ---------------------------------------------------------------------------

    def upgradable(self, cube: Path, lock: Lock) -> dict[str, bool]:
        """The kind's files ``upgrade`` looks at (the lock's, read in ``cube``), each with
        whether it is in an older format (``upgrade`` rewrites it); {}: none."""
        return {}

    def upgrade(self, path: Path, model: str | Path, revision: str | None) -> bool | None:
        """Rewrite the file ``path`` (in a staging folder, or a lone file given to
        ``cubepack upgrade``) in the current format, proved against ``model``: True when
        rewritten, False when it is current already, None when it is no file of this kind."""
        return None

    # --- encrypt ---------------------------------------------------------------------------

    def counts(self, lock: Lock) -> dict[str, int]:
        """What a private cube's public lock counts of the kind (``{section: n}``)."""
        return {}

    def files(self, lock: Lock) -> set[str]:
        """The clear files holding the kind's memories (their ciphertexts are listed under
        :attr:`memory` in a private cube's public config)."""
        return set()

    # --- load ------------------------------------------------------------------------------

    def load(self, *args: Any, **kwargs: Any) -> Any:
        """The kind's own load into a live model, called by the public verb :attr:`serves`
        once the policy is honoured (and a cube verified); its arguments are the kind's.

        Raises:
            UnsupportedError: the kind serves no load verb.
        """
        raise UnsupportedError(f"cubepack loads no {self.name} memory by itself.")

    # --- the MemOS hook ----------------------------------------------------------------------

    def memos_own(self, lock: Lock) -> bool:
        """Does the kind load the cube's memories into its MemOS memory itself (``load_memos``),
        so that MemOS's own load of that memory is not called?"""
        return False

    def check_memos_config(self, job: LoadJob) -> None:
        """Before MemOS builds anything (``job.built`` False): refuse what the MemOS config
        (``job.config``) decides of the kind's memories, so a refusal leaves nothing built
        or loaded (the adapters' bases: MemOS applies no adapter, its config names the
        base)."""

    def load_memos(self, job: LoadJob) -> tuple[Any, ...]:
        """The cube is verified (and a private one decrypted): check the kind's memories
        against the live memory ``job.memory(self)`` (None: that memory is not loaded here)
        and its models, as ``job.policy`` asks (a mismatch: error, drop or rebuild), record
        the outcome in ``job.report``, and place them into the memory, or return them typed
        (each carrying its producer, its provenance label and its seals) for the hook to
        place where only it can (its registry of producers). Nothing is placed when a check
        refuses."""
        return ()
