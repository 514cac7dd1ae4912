"""What the kernel-vs-per-key micro-benchmarks (``bench_*_kernel.py``) share: their options."""

from __future__ import annotations

import argparse


def parse_args(doc: str) -> argparse.Namespace:
    """``--changes`` in the measured batch, ``--repeats`` per path (medians), ``--seed``."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--changes", type=int, default=60_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=7)
    return ap.parse_args()
