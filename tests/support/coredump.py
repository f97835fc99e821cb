"""What a core dump of this process would hold, read in place: every region the kernel's
default ``coredump_filter`` writes (private and shared anonymous memory, memfd maps included),
less the regions advised MADV_DONTDUMP (``dd`` in smaps). The equivalent of ``gcore`` without
ptrace, so it runs where ptrace is blocked. A marker is looked for *shifted* (each byte + 1):
the process scanning itself never holds the marker unless something decrypted it."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator

_PLUS_ONE = bytes((b + 1) % 256 for b in range(256))


def shift(marker: str) -> str:
    """``marker`` with each byte + 1: what a test hands a process that must not hold it."""
    return bytes((b + 1) % 256 for b in marker.encode("ascii")).decode("latin-1")


def _filter() -> int:
    try:
        with open("/proc/self/coredump_filter", encoding="ascii") as handle:
            return int(handle.read().strip(), 16)
    except OSError:
        return 0x33


def dumped_regions() -> Iterator[tuple[int, int]]:
    """(begin, end) of every readable region a core dump of this process would hold."""
    dump = _filter()
    region = None
    with open("/proc/self/smaps", encoding="ascii", errors="replace") as smaps:
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and ":" not in fields[0]:
                begin, end = (int(part, 16) for part in fields[0].split("-"))
                path = fields[5] if len(fields) > 5 else ""
                shared = fields[1][3] == "s"
                anonymous = path in ("", "[heap]", "[stack]") or path.startswith("[anon")
                # A shared map of a file with no link (memfd, /dev/zero, SysV shm) is
                # "anonymous shared" to the kernel's dumper (coredump_filter bit 1).
                unlinked = path.startswith(("/memfd:", "/dev/zero", "/SYSV")) or (
                    shared and line.rstrip().endswith("(deleted)"))
                wanted = ((anonymous and not shared and dump & 1)
                          or ((anonymous or unlinked) and shared and dump & 2))
                region = (begin, end) if "r" in fields[1] and wanted else None
            elif fields[0] == "VmFlags:" and region and "dd" not in fields[1:]:
                yield region


def holds(shifted: str) -> bool:
    """Does any region a core dump would hold contain the marker whose shifted form is
    ``shifted``?"""
    return holds_any([shifted])


def holds_any(shifted: list[str]) -> bool:
    """Does any region a core dump would hold contain any of the markers whose shifted forms
    are ``shifted``? One scan for them all (a scan reads every dumped region: hundreds of
    MB once torch is loaded)."""
    wanted = [marker.encode("latin-1") for marker in shifted]
    with open("/proc/self/mem", "rb", buffering=0) as memory:
        for begin, end in list(dumped_regions()):
            try:
                data = os.pread(memory.fileno(), end - begin, begin)
            except OSError:  # a guard page, a region gone since smaps was read
                continue
            data = data.translate(_PLUS_ONE)
            if any(data.find(marker) >= 0 for marker in wanted):
                return True
            del data
    return False


def dumpable() -> bool:
    """Would this process dump core (``PR_GET_DUMPABLE``)? A scan of an undumpable process
    proves nothing."""
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(3, 0, 0, 0, 0) != 0
