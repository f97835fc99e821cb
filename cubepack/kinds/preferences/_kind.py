"""The preference kind's phases: MemOS's preference memory (``pref_mem``) pinned to its
embedder by pack, checked by verify (its file against the lock, then its vectors re-embedded
when asked), re-embedded by migrate, counted by a private cube's manifest."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

from ..._util import atomic, constants
from ..._util.checks import Catalogue
from ..._util.paths import resolve_inside
from ...errors import CubepackError, FormatError, IdentityMismatch, IntegrityError, Mismatch
from ...errors import UsageError
from ...format.sections import Lock
from ...format.sections import preferences as _section
from ...format.sections.locator import Locator
from ...memos_format._layout import opened_path, read_config
from ...trust._lineage import pin_label
from ...trust._policy import TrustPolicy
from ...trust._report import VerifyReport
from .._kind import Kind, LoadJob, MigrateJob, PackJob
from ..vectors._embedder import BATCH, embed, probe_vectors
from ..vectors._migrate import embedder_label, rename_embedder
from . import _check, _dump, _memos

#: What pack pins for the embedder when config.json names none (an informational pin).
_UNNAMED_PIN = {"name": None, "strict": False, "repo_id": None, "revision": None,
                "identity": None, "reason": "config.json names no embedder"}


def preference_file(config: dict[str, Any], files: list[str]) -> str | None:
    """The cube file MemOS's preference memory reads (``pref_mem``'s ``memory_filename`` by the
    path MemOS opens), when config.json has a preference memory and the cube holds that file.

    Raises:
        UsageError: the preference memory and the text memory share one file (the fix: a
            ``memory_filename`` of its own, see :func:`_dump.filename_collision`).
    """
    collision = _dump.filename_collision(config, opened_path)
    if collision is not None:
        raise UsageError(collision)
    name = _dump.filename(config)
    opened = opened_path(name) if name is not None else None
    return opened if opened in set(files) else None


class Preferences(Kind):
    """MemOS's preference memory: its items' dense vectors pinned to the embedder that made
    them (the lock's ``preferences`` section, its embedder a pin of ``models``)."""

    name: ClassVar[str] = "preferences"
    section: ClassVar[str | None] = "preferences"
    memos_memory: ClassVar[str | None] = "pref_mem"
    memos_classes: ClassVar[tuple[str, ...]] = ("PreferenceTextMemory",)

    # --- the MemOS hook --------------------------------------------------------------------

    def memos_own(self, lock: Lock) -> bool:
        """A cube's preferences are loaded here, item by item and counted: MemOS's own load
        of its dump swallows a validation error and loads nothing."""
        return bool(lock.preferences)

    def load_memos(self, job: LoadJob) -> tuple[Any, ...]:
        memory = job.memory(self)
        if memory is not None and job.lock.preferences:
            _memos.load_preferences(memory, job.cube, job.lock, job.report, job.policy)
        return ()

    # --- pack ------------------------------------------------------------------------------

    def pin(self, job: PackJob) -> None:
        """Read the preference memory strictly, refuse a file shared with the text memory,
        pin its embedder (informational unless pack was given it: then it must reproduce a
        sample of the vectors, and its probe vectors are recorded)."""
        name = preference_file(job.config, job.files)
        if name is None:
            return
        found = _check.read_items(job.cube, name)
        if not found:  # MemOS dumps an empty memory as empty collections: nothing to pin
            return
        record = _dump.record(found, name)
        job.pins.setdefault(_dump.EMBEDDER_ROLE, dict(_UNNAMED_PIN))
        spec = job.options.embedder
        if spec:
            entry = _typed(name, record)
            failures = [c for c in _check.embedder_checks(
                job.cube, entry, lambda texts: embed(spec, texts), label=spec, found=found)
                if not c.ok]
            if failures:
                raise IdentityMismatch(f"The preference memory {name}", [
                    Mismatch(f"embedder {c.subject}", "its stored vector", c.detail)
                    for c in failures], "--embedder did not make these vectors; give the "
                    "embedder that did.", finding="was made by another embedder")
            record["probes"] = probe_vectors(spec)
        job.state[self.name] = record

    def entries(self, job: PackJob, staging: Path, digests: dict[str, str],
                pins: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """The ``preferences`` section: the entry ``pin`` made, read again from the staged
        file this pack hashed (a file changed since ``pin`` read it is refused)."""
        record = job.state.get(self.name)
        if record is None:
            return {}
        name = record["file"]
        if name not in digests:
            raise IntegrityError(f"The preference memory {name} was not hashed by this pack.")
        again = _dump.record(_check.read_items(staging, name), name)
        if {k: v for k, v in record.items() if k != "probes"} != again:
            raise IntegrityError(f"The preference memory {name} changed while it was packed; "
                                 "pack it again.")
        return {name: {key: value for key, value in record.items() if key != "file"}}

    # --- verify ----------------------------------------------------------------------------

    def check_bytes(self, report: VerifyReport, lock: Lock, intact: set[str]) -> None:
        """Each preference file the lock records says what its entry says (counts,
        collections, dimension; every item well formed), and a preference memory the cube's
        config.json names is recorded (a record removed would skip every check of it)."""
        cube = report.cube_dir
        for name, entry in sorted(lock.preferences.items()):
            if name not in intact:
                continue  # missing or not the lock's bytes: reported by the file checks
            try:
                problems = _check.disagreements(_check.read_items(cube, name), entry)
            except CubepackError as exc:
                report.add(Catalogue.PREFERENCES, name, False, str(exc))
                continue
            for field, expected, found in problems:
                report.add(Catalogue.PREFERENCES, f"{name} {field}", False,
                           "the preference memory differs from the lock", expected, found)
            if not problems:
                report.add(Catalogue.PREFERENCES, name, True,
                           f"{entry.count} items of dimension {entry.dimension} as the lock "
                           f"records, embedder {entry.embedder}", role=entry.embedder)
        if constants.MEMOS_CONFIG not in intact or lock.private:
            return
        try:
            config = read_config(cube, sorted(intact))
        except ValueError:
            return  # not strict JSON: the content check reports it
        try:
            name = preference_file(config, sorted(intact))
            holds = name is not None and bool(_check.read_items(cube, name))
        except CubepackError as exc:
            report.add(Catalogue.PREFERENCES, "*", False, str(exc))
            return
        if holds and name not in lock.preferences:
            fix = (f"pack the cube again (cubepack pack {cube}) to record it, and sign it "
                   "again if it was signed (cubepack sign)")
            report.add(Catalogue.PREFERENCES, name, False, (
                f"config.json names this preference memory but the lock, version "
                f"{lock.version}, was written before cubepack recorded preference memories "
                f"(lock version {_section.SINCE}): its vectors are pinned to no embedder, and "
                f"MemOS's own load of them loads nothing; {fix}")
                if lock.version < _section.SINCE else (
                "config.json names this preference memory but the lock records none of it (a "
                f"packed cube always does: was the record removed?); {fix}"),
                "a preferences entry", "none")

    def check_proofs(self, report: VerifyReport, lock: Lock, policy: TrustPolicy) -> None:
        """``verify --embedder``: the embedder re-embeds a sample of each preference memory."""
        if not lock.preferences or not policy.asks(Catalogue.EMBEDDER):
            return
        asked = policy.reembedding()
        spec = asked.embedder
        if spec is None:
            return
        for name, entry in sorted(lock.preferences.items()):
            try:
                report.extend(_check.embedder_checks(
                    report.cube_dir, entry, lambda texts: embed(spec, texts), label=spec,
                    seed=asked.seed, size=asked.sample))
            except CubepackError as exc:
                report.add(Catalogue.EMBEDDER, name, False, str(exc), role=entry.embedder)

    # --- migrate ---------------------------------------------------------------------------

    def rewrites(self, job: MigrateJob) -> set[str]:
        return set(job.lock.preferences) if job.embedder else set()

    def migrate(self, job: MigrateJob) -> None:
        """``migrate --embedder``: every item's memory text embedded again by the new
        embedder, in batches, written with everything else as it was (pack then records the
        new vectors and probes)."""
        if not job.embedder:
            return
        spec = job.embedder
        done = 0
        for name in sorted(job.lock.preferences):
            data = _dump.read(resolve_inside(job.cube, name))
            found = _dump.items(data, name)
            fresh: dict[str, list[float]] = {}
            for start in range(0, len(found), BATCH):
                batch = found[start:start + BATCH]
                vectors = embed(spec, [item.memory for item in batch])
                if not isinstance(vectors, list) or len(vectors) != len(batch):
                    raise FormatError(f"The embedder {spec} returned a wrong number of vectors "
                                      f"for {name}; nothing was written.")
                fresh.update((item.key, [float(x) for x in vector])
                             for item, vector in zip(batch, vectors))
            if len({len(vector) for vector in fresh.values()}) > 1:
                raise FormatError(f"The embedder {spec} returned vectors of several dimensions "
                                  f"for {name}; nothing was written.")
            document = _dump.with_vectors(data, fresh)
            atomic.write_text(resolve_inside(job.staging, name),
                              json.dumps(document, ensure_ascii=False, indent=4) + "\n")
            done += len(fresh)
        if job.config is not None:
            rename_embedder(job.config, spec, _dump.EMBEDDER_ROLE)
        job.state[self.name] = done
        if done and not job.lineage.get("reembedded"):
            # The vectors kind (before this one in KINDS) stated the text memory's embedder,
            # and re-embedded nothing: the change is this memory's, from the embedder it pins.
            job.lineage["embedder"] = {
                "from": pin_label(job.lock.models.get(_dump.EMBEDDER_ROLE)),
                "to": embedder_label(spec)}
        # Added to what the vectors kind (before this one in KINDS) re-embedded.
        job.lineage["reembedded"] = job.lineage.get("reembedded", 0) + done
        job.result["reembedded"] = job.result.get("reembedded", 0) + done

    # --- encrypt ---------------------------------------------------------------------------

    def files(self, lock: Lock) -> set[str]:
        return set(lock.preferences)


def _typed(name: str, record: dict[str, Any]) -> _section.Preferences:
    """The frozen entry of a record pack is making (before its lock exists)."""
    return _section.Preferences(file=name, embedder=record["embedder"], collections=record["collections"],
                 count=record["count"], dimension=record["dimension"],
                 sample=tuple(record["sample"]), probes=None,
                 locator=Locator.whole(name, 0, ""))
