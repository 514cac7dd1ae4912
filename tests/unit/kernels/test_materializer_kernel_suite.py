"""The per-key materializer suite (tests/unit/stages/test_materializer.py), every test run
again with the harness driving the batch kernel instead of ``PerKeyAdapter``: the kernel must
pass what the per-key stage passes, asserting the same."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "stages"))

import stage_harness  # noqa: E402
from test_materializer import *  # noqa: E402,F401,F403

from tidemark.engine.kernels.materializer import MaterializerKernel  # noqa: E402


@pytest.fixture(autouse=True)
def _kernel_harness(monkeypatch):
    monkeypatch.setattr(stage_harness, "PerKeyAdapter", MaterializerKernel)


def test_harness_runs_the_kernel():
    h = stage_harness.Harness(t1("NOTHING"))  # noqa: F405
    assert isinstance(h.adapter, MaterializerKernel)
