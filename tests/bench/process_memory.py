"""The resident memory of a process tree, each address space counted once.

Both systems' samplers use it (``tidemark_runner.RssSampler``, ``flink_runner.RssSampler``), so
the two are measured by one rule. A plain sum of every process's RSS counts one address space
twice whenever a process is between a ``vfork``/``clone(CLONE_VM)`` and its ``exec``: the child
shares its parent's memory, and ``/proc`` reports the parent's whole RSS for it. The JVM starts
every process that way (``posix_spawn``: Spark's Python daemons, data source planners and
source runners), so a sample taken while it starts one saw the JVM two or three times (hundreds
of MB that do not exist). ``kcmp(2)`` with ``KCMP_VM`` says whether two processes share one
address space; where it cannot answer (another OS, no permission, a process gone), the process
is counted, as a plain sum would.

Pages a forked child shares copy-on-write with its parent (Spark's Python workers and their
daemon) are separate address spaces and still counted in each: RSS, not PSS.
"""

from __future__ import annotations

import ctypes
import os
import platform

import psutil

_KCMP_VM = 1
_KCMP_SYSCALL = {"x86_64": 312, "aarch64": 272}.get(platform.machine())
_libc = ctypes.CDLL(None, use_errno=True) if _KCMP_SYSCALL is not None and os.name == "posix" else None


def shares_address_space(a: int, b: int) -> bool:
    """Whether processes ``a`` and ``b`` share one address space (False when unknown)."""
    if _libc is None:
        return False
    return _libc.syscall(_KCMP_SYSCALL, a, b, _KCMP_VM, 0, 0) == 0


def tree_rss(root: psutil.Process, include_root: bool = True) -> int:
    """Summed RSS of ``root``'s descendants (and ``root``), a child that shares its parent's
    address space not counted again."""
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for p in procs if include_root else procs[1:]:
        try:
            # asked before the RSS is read: a clone that execs in between then shows its new
            # image's RSS, never its parent's
            if p is not root and shares_address_space(p.pid, p.ppid()):
                continue
            total += p.memory_info().rss
        except psutil.Error:
            continue
    return total
