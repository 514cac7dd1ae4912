"""The one driver loop: what every host relies on, shown on a tiny stage with timers."""

from __future__ import annotations

from stage_harness import c
from tidemark.engine.batch import ChangeBatch
from tidemark.engine.changelog import Change
from tidemark.engine.driver import Bucket, PerKeyAdapter, batch_stage
from tidemark.engine.stage import BatchContext


class Count:
    """Counts rows per key; emits the count; asks to be woken at ``now + 10`` while odd."""

    name, n_inputs = "count", 1

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def key_of(self, change: Change, input_index: int) -> tuple:
        return (change.row[0],)

    def process_key(self, key, inputs, state, ctx):
        self.calls.append((ctx.now_ms, key, len(inputs[0])))
        n = (state[0] if state else 0) + sum(ch.weight for ch in inputs[0])
        if n == 0:
            return None, [Change("-D", key, ())]
        return (n, ctx.now_ms + 10 if n % 2 else None), [Change("+U", key + (n,), ())]

    def wakeup_ms(self, state):
        return state[1]


def run(adapter, bucket, now_ms, *changes, groups=None):
    batch = ChangeBatch(changes=list(changes), groups=groups)
    return adapter.process_batch([batch], bucket, BatchContext(now_ms=now_ms))


def test_keys_are_grouped_and_due_keys_woken_without_records():
    stage = Count()
    adapter, bucket = PerKeyAdapter(stage), Bucket()
    bucket, out = run(adapter, bucket, 0, c("+I", "a", 1), c("+I", "b", 2), c("+I", "b", 3))
    assert sorted(out.changes()) == [Change("+U", ("a", 1), ()), Change("+U", ("b", 2), ())]
    assert bucket.states == {("a",): (("a",), (1, 10)), ("b",): (("b",), (2, None))}
    assert bucket.due == {("a",): 10}  # b's count is even: no timer
    bucket, out = run(adapter, bucket, 10)
    assert stage.calls[-1] == (10, ("a",), 0)  # woken with no records, its key from the state
    assert out.changes() == [Change("+U", ("a", 1), ())]
    assert bucket.due == {("a",): 20}


def test_host_groups_key_state_by_their_ids_and_a_reloaded_bucket_finds_its_timers():
    stage = Count()
    adapter = PerKeyAdapter(stage)
    bucket, _ = run(adapter, Bucket(), 0, c("+I", "a", 1), groups=[b"'a'"])
    assert bucket.states == {b"'a'": (("a",), (1, 10))}
    reloaded = Bucket.load(stage, dict(bucket.states))
    assert reloaded.due == {b"'a'": 10} and reloaded.next_wakeup() == 10
    reloaded, out = run(adapter, reloaded, 10)
    assert stage.calls[-1] == (10, ("a",), 0)
    assert out.changes() == [Change("+U", ("a", 1), ())]


def test_stages_without_timers_keep_plain_states_and_no_index():
    stage = Count()
    stage.uses_timers = False
    bucket, _ = run(PerKeyAdapter(stage), Bucket(), 0, c("+I", "a", 1), c("+I", "a", 2), c("-D", "a", 2))
    assert bucket.states == {("a",): (1, 10)} and bucket.due == {}


def test_per_key_stages_run_behind_the_adapter_and_kernels_as_they_are():
    class Kernel:
        name, n_inputs = "kernel", 1

        def process_batch(self, inputs, state, ctx):
            return state, inputs[0]

    assert isinstance(batch_stage(Count()), PerKeyAdapter)
    kernel = Kernel()
    assert batch_stage(kernel) is kernel
