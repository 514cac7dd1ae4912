"""The benchmark's memory rule: every address space of a process tree counted once."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import process_memory  # noqa: E402

pytestmark = pytest.mark.skipif(process_memory._libc is None, reason="kcmp(2) is Linux-only")


def test_a_process_shares_its_own_address_space_and_not_a_forked_childs():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert process_memory.shares_address_space(os.getpid(), os.getpid())
        assert not process_memory.shares_address_space(os.getpid(), child.pid)
    finally:
        child.kill()
        child.wait()


def test_tree_rss_counts_every_separate_child():
    children = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) for _ in range(2)]
    try:
        me = psutil.Process()
        own = me.memory_info().rss
        kids = [psutil.Process(c.pid).memory_info().rss for c in children]
        total = process_memory.tree_rss(me)
        # both children counted (RSS moves a little between the reads)
        assert total > own + 0.9 * sum(kids)
        assert process_memory.tree_rss(me, include_root=False) < total
    finally:
        for c in children:
            c.kill()
            c.wait()
