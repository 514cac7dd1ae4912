"""DO NOTHING and DO ERROR on the stored table (``kernels.current_row``) against the per-key
stage: over random multi-batch inputs (a few PKs, with and without an upsert key, conflicts,
exact pairs, retractions of active and never-added rows, identical copies), with the state
stored between batches as the Spark host stores it, the columnar path emits the same changes
in the same order, stores the same bytes, counts the same metrics and raises the same error
as ``PerKeyAdapter``. The literal cases are records in, records out."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from tidemark.engine.changelog import Change
from tidemark.engine.driver import PerKeyAdapter
from tidemark.engine.errors import ConflictError
from tidemark.engine.kernels.current_row import CurrentRowKernel
from tidemark.engine.kernels.materializer import MaterializerKernel
from tidemark.engine.stages.materializer import SinkMaterializer
from test_deduplicate_kernel import TYPED, StoredHost, batches, columnar_calls


def sink(strategy: str, upsert_key) -> SinkMaterializer:
    return SinkMaterializer("t", (0,), ("id",), upsert_key, strategy, columns=TYPED)


class ErrorHost(StoredHost):
    """A stored host that reports ``ConflictError`` as a result."""

    def run(self, changes: list[Change]) -> list[tuple]:
        try:
            return super().run(changes)
        except ConflictError as e:
            return [("error", str(e))]


@settings(max_examples=400, deadline=None)
@given(strategy=st.sampled_from(["NOTHING", "ERROR"]), upsert_key=st.sampled_from([None, (1,), (1, 2)]),
       batches=batches)  # fmt: skip
def test_the_columnar_path_equals_the_per_key_stage(strategy, upsert_key, batches):
    stage = sink(strategy, upsert_key)
    columnar, per_key = ErrorHost(stage, MaterializerKernel(stage)), ErrorHost(stage, PerKeyAdapter(stage))
    for i, changes in enumerate(batches):
        timed = [Change(x.kind, x.row, (i, *x.pos)) for x in changes]
        got, want = columnar.run(timed), per_key.run(timed)
        assert got == want
        if want and want[0][0] == "error":
            return
        assert columnar.stored == per_key.stored
        assert columnar.metrics == per_key.metrics


def test_nothing_keeps_the_current_row_and_counts_the_other():
    host = StoredHost(sink("NOTHING", (1,)), MaterializerKernel(sink("NOTHING", (1,))))
    assert host.run([Change("+I", (1, 10, "a"), (1,))]) == [("+I", (1, 10, "a"), (1,))]
    assert host.run([Change("+I", (1, 20, "b"), (2,))]) == []
    assert host.metrics == Counter(conflicts_dropped=1)
    assert host.run([Change("-D", (1, 10, "a"), (3,))]) == [("-D", (1, 10, "a"), (3,))]


def test_error_names_the_pk_and_the_two_rows():
    host = ErrorHost(sink("ERROR", (1,)), MaterializerKernel(sink("ERROR", (1,))))
    host.run([Change("+I", (1, 10, "a"), (1,))])
    assert host.run([Change("+I", (1, 20, "b"), (2,))]) == [(
        "error", "ON CONFLICT DO ERROR: table 't' received two active rows with different upsert keys for primary key "
        "(id=1): active rows (1, 10, 'a') and (1, 20, 'b')",
    )]  # fmt: skip


def test_typed_batches_take_the_columnar_path(monkeypatch):
    calls = columnar_calls(monkeypatch, CurrentRowKernel)
    host = StoredHost(sink("NOTHING", None), MaterializerKernel(sink("NOTHING", None)))
    host.run([Change("+I", (1, 10, "x"), (0,))])
    host.run([Change("-D", (1, 10, "x"), (1,))])
    assert calls == [True, True]
