"""The preference memory's checks: its file against its lock entry (structure and counts, no
model), and the re-embedding check (a live embedder must reproduce the stored vectors of
items this process draws at random, and the probe vectors the lock records).

Pack, verify, migrate and the MemOS hook share these; each turns what they find into report
checks (``Catalogue.PREFERENCES``, ``Catalogue.EMBEDDER``) or a refusal.
"""

from __future__ import annotations

import random
import secrets
from collections.abc import Callable
from pathlib import Path

from ..._util.checks import CLAIMED, Catalogue
from ..._util.paths import resolve_inside
from ...errors import IntegrityError
from ...format.sections import Preferences
from ...trust._report import Check
from ..vectors._embedder import BATCH
from ..vectors._vectors import COSINE_THRESHOLD, PROBES, cosine
from . import _dump

#: Items a check re-embeds by default (all, when the memory holds fewer).
SAMPLE_SIZE = _dump.SAMPLE_SIZE


def read_items(cube: Path, name: str) -> list[_dump.Item]:
    """The items of the preference memory ``name`` in ``cube``, read through the path rule (a
    regular file inside the cube) and strictly (:func:`_dump.items`).

    Raises:
        IntegrityError: not a regular file in the cube.
        FormatError: not a preference memory's dump.
    """
    path = resolve_inside(cube, name)
    if path.is_symlink() or not path.is_file():
        raise IntegrityError(f"The preference memory {name} is not a regular file in the cube.")
    return _dump.items(_dump.read(path), name)


def disagreements(found: list[_dump.Item], entry: Preferences) -> list[tuple[str, object,
                                                                           object]]:
    """(field, the lock's, the file's) for each count or dimension the file and its lock entry
    disagree on."""
    collections: dict[str, int] = {}
    for item in found:
        collections[item.collection] = collections.get(item.collection, 0) + 1
    dimensions = sorted({len(item.vector) for item in found})
    problems: list[tuple[str, object, object]] = []
    if len(found) != entry.count:
        problems.append(("count", entry.count, len(found)))
    if collections != dict(entry.collections):
        problems.append(("collections", dict(entry.collections), collections))
    if dimensions != [entry.dimension]:
        problems.append(("dimension", entry.dimension, dimensions))
    return problems


def require_agreement(found: list[_dump.Item], entry: Preferences) -> None:
    """Raise :class:`IntegrityError` when the items are not the ones the lock counts."""
    problems = disagreements(found, entry)
    if problems:
        field, expected, got = problems[0]
        raise IntegrityError(f"The preference memory {entry.file} holds {field} {got}; the lock "
                             f"records {expected}. Pull or pack the cube again.")


def embedder_checks(cube: Path, entry: Preferences,
                    embed_texts: Callable[[list[str]], list[list[float]]], *, label: str,
                    seed: int | None = None, size: int | None = SAMPLE_SIZE,
                    found: list[_dump.Item] | None = None) -> list[Check]:
    """Re-embed items drawn at random by this process (``seed``, reported; ``size`` of them,
    0 or None: all, in batches) with ``embed_texts`` and compare each with its stored vector;
    then the lock's probe vectors, if any. One check per item and per probe, each
    ``Catalogue.EMBEDDER`` with the role of the entry's embedder.

    Raises:
        IntegrityError: the file is not what the lock entry counts (see
            :func:`require_agreement`).
    """
    found = read_items(cube, entry.file) if found is None else found
    require_agreement(found, entry)
    seed = secrets.randbits(32) if seed is None else seed
    every = not size or size >= len(found)
    drawn = list(found) if every else random.Random(seed).sample(found, size)
    fresh = [vector for start in range(0, len(drawn), BATCH)
             for vector in embed_texts([item.memory for item in drawn[start:start + BATCH]])]
    scope = (f"all {len(drawn)} preferences" if every else
             f"{len(drawn)} of {len(found)} preferences drawn at random (seed {seed}); "
             "--embedder-sample 0 checks all")
    checks = [compare(f"{entry.file} ({item.key})", list(item.vector), vector, label, scope,
                      entry.embedder) for item, vector in zip(drawn, fresh)]
    if entry.probes:
        for index, (expected, vector) in enumerate(zip(entry.probes,
                                                       embed_texts(list(PROBES)))):
            check = compare(f"{entry.file} probe {index}", list(expected), vector, label,
                            "the lock's probe vectors", entry.embedder)
            check.basis = CLAIMED  # the expected vectors are the packer's word
            checks.append(check)
    return checks


def compare(subject: str, expected: list[float], vector: list[float], label: str, scope: str,
            role: str) -> Check:
    """One re-embedded vector against the stored one: the same dimension and cosine >=
    :data:`COSINE_THRESHOLD`."""
    if len(vector) != len(expected):
        return Check(Catalogue.EMBEDDER, subject, False,
                     f"{label} gives {len(vector)}-dimensional vectors; the preferences' were "
                     f"made by a {len(expected)}-dimensional embedder", len(expected),
                     len(vector), role=role)
    similarity = cosine(expected, list(vector))
    ok = similarity >= COSINE_THRESHOLD
    return Check(Catalogue.EMBEDDER, subject, ok,
                 f"cosine {similarity:.6f} with the stored vector ({scope})"
                 + ("" if ok else f" < {COSINE_THRESHOLD}: another embedder made these "
                    "vectors; re-embed the preferences with this one (cubepack migrate "
                    "--embedder) or use the embedder that made them"), role=role)
