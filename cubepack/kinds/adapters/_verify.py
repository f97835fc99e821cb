"""What ``verify`` checks of a cube's adapters: each adapter's files against its lock entry
(headers and JSON only, before anything is trusted), and a matched base model against the
shapes each adapter was packed for."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..._util.budget import checkpoint
from ..._util.checks import Catalogue
from ...errors import CubepackError
from ...format.sections import Lock
from ...trust._report import VerifyReport
from . import _lora as adapters_mod


def check_files(report: VerifyReport, lock: Lock, good: set[str]) -> None:
    """Each adapter's files say what the lock says (type, rank, targets, dtype, the base shape
    each LoRA module implies), and no adapter folder ships without an entry. Headers and JSON
    only: no base model is needed (the ``adapter base`` check compares a base)."""
    entries = lock.adapters
    try:
        folders = adapters_mod.adapter_folders(list(lock.files))
    except CubepackError as exc:
        report.add(Catalogue.ADAPTER, "*", False, str(exc))
        return
    for name in sorted(set(folders) - set(entries)):
        report.add(Catalogue.ADAPTER, folders[name], False, "an adapter folder the lock does "
                   "not pin to a base (pack the cube again)", "an adapters entry", "none")
    for name, entry in sorted(entries.items()):
        subject = f"{entry.path}/ ({name})"
        if not all(locator.path in good for locator in entry.locators):
            continue  # missing or not the lock's bytes: reported by the file checks
        checkpoint(f"adapter {name}")
        try:
            info = adapters_mod.read_adapter(report.cube_dir, name)
        except CubepackError as exc:
            report.add(Catalogue.ADAPTER, subject, False, str(exc))
            continue
        problems = adapters_mod.entry_mismatches(entry, info)
        for problem in problems:
            report.add(Catalogue.ADAPTER, f"{subject} {problem.field}", False,
                       "the adapter's files differ from the lock", problem.expected,
                       problem.found)
        if not problems:
            report.add(Catalogue.ADAPTER, subject, True,
                       "config and LoRA tensor shapes agree with the lock: "
                       + adapters_mod.describe_entry(
                           entry, lock.models.get(entry.model_role)))


def check_base(report: VerifyReport, lock: Lock, role: str,
                        base: Any) -> None:
    """The base at hand (a folder, or a loaded model) has the weight shapes each LoRA module
    of the adapter pinned to ``role`` was packed against, read from its own files now."""
    for name, entry in sorted(lock.adapters.items()):
        if entry.model_role != role:
            continue
        try:
            shapes = adapters_mod.folder_shapes(Path(base)) if isinstance(base, (str, Path)) \
                else adapters_mod.model_shapes(base)
        except CubepackError as exc:
            report.add(Catalogue.ADAPTER_BASE, f"{entry.path}/ ({name})", False, str(exc),
                       role=role)
            continue
        bad = [(module, list(fit.shape), list(shapes[module + ".weight"])
                if module + ".weight" in shapes else "absent")
               for module, fit in sorted(entry.modules.items())
               if list(shapes.get(module + ".weight", ())) != list(fit.shape)]
        for module, expected, found in bad:
            report.add(Catalogue.ADAPTER_BASE, f"{entry.path}/ ({name}) module {module}", False,
                       "the base's weight has another shape than the adapter was packed "
                       "against", expected, found, role=role)
        if not bad:
            report.add(Catalogue.ADAPTER_BASE, f"{entry.path}/ ({name})", True,
                       f"the base's weights have the shapes of all {len(entry.modules)} "
                       "adapted modules", role=role)
