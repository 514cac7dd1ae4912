"""Changelog producers: none (upserts), input (records as received), lookup (full changelog
per batch, row-deduplicate), full-compaction (diffs at barriers, wake-ups)."""

from __future__ import annotations

from merge_harness import c, harness, kinds

PU = {"merge-engine": "partial-update"}


def test_none_emits_upserts_without_before_images():
    h = harness("k,a,b", {**PU, "partial-update.remove-record-on-delete": "true"}, input_retracts=True)
    assert kinds(h.run([c("+I", 1, "a", None, pos=1)])) == [("+I", (1, "a", None))]
    assert kinds(h.run([c("+I", 1, None, "b", pos=2)])) == [("+U", (1, "a", "b"))]
    assert kinds(h.run([c("+I", 1, None, "b", pos=3)])) == []  # no change, nothing to upsert
    assert kinds(h.run([c("-D", 1, None, None, pos=4)])) == [("-D", (1, "a", "b"))]


def test_input_emits_the_records_as_received_in_position_order():
    h = harness("k,a,b", {**PU, "changelog-producer": "input"})
    out = h.run([c("+I", 1, None, "b", pos=2), c("+I", 1, "a", None, pos=1)])
    assert kinds(out) == [("+I", (1, "a", None)), ("+I", (1, None, "b"))]
    assert h.row(1) == (1, "a", "b")


def test_lookup_emits_full_changelog_per_batch():
    h = harness("k,a,b", {**PU, "changelog-producer": "lookup"})
    out = h.run([c("+I", 1, "a", None, pos=1), c("+I", 1, None, "b", pos=2)])
    assert kinds(out) == [("+I", (1, "a", "b"))]  # no flicker inside a batch
    out = h.run([c("+I", 1, "A", None, pos=3)])
    assert kinds(out) == [("-U", (1, "a", "b")), ("+U", (1, "A", "b"))]
    assert all(ch.pos == (3,) for ch in out)


def test_lookup_without_row_deduplicate_re_emits_unchanged_row():
    h = harness("k,a", {**PU, "changelog-producer": "lookup"})
    h.run([c("+I", 1, "a", pos=1)])
    assert kinds(h.run([c("+I", 1, "a", pos=2)])) == [("-U", (1, "a")), ("+U", (1, "a"))]


def test_lookup_row_deduplicate_drops_no_op_pairs():
    h = harness("k,a", {**PU, "changelog-producer": "lookup",
                        "changelog-producer.row-deduplicate": "true"})
    h.run([c("+I", 1, "a", pos=1)])
    assert h.run([c("+I", 1, "a", pos=2)]) == []
    assert kinds(h.run([c("+I", 1, "b", pos=3)])) == [("-U", (1, "a")), ("+U", (1, "b"))]


def test_lookup_delete():
    h = harness("k,a", {"changelog-producer": "lookup"}, input_retracts=True)
    h.run([c("+I", 1, "a", pos=1)])
    assert kinds(h.run([c("-D", 1, "a", pos=2)])) == [("-D", (1, "a"))]


def test_lookup_ignored_deletes_emit_nothing():
    h = harness("k,a", {**PU, "changelog-producer": "lookup", "ignore-delete": "true"},
                input_retracts=True)
    h.run([c("+I", 1, "a", pos=1)])
    assert h.run([c("-D", 1, "a", pos=2)]) == []
    assert h.metrics["merge_deletes_ignored"] == 1


def test_first_row_lookup_is_insert_only():
    h = harness("k,a", {"merge-engine": "first-row", "changelog-producer": "lookup",
                        "ignore-delete": "true"}, input_retracts=True)
    out = []
    for i, (kind, v) in enumerate([("+I", "a"), ("-U", "a"), ("+U", "b"), ("-D", "b"), ("+I", "c")]):
        out += h.run([c(kind, 1, v, pos=i)])
    assert kinds(out) == [("+I", (1, "a"))]


FC = {**PU, "changelog-producer": "full-compaction"}


def test_full_compaction_interval_zero_emits_every_batch():
    h = harness("k,a,b", FC)
    assert kinds(h.run([c("+I", 1, "a", None, pos=1)])) == [("+I", (1, "a", None))]
    assert kinds(h.run([c("+I", 1, None, "b", pos=2)])) == [("-U", (1, "a", None)), ("+U", (1, "a", "b"))]


def test_full_compaction_merges_changes_between_barriers():
    h = harness("k,a,b", {**FC, "changelog-producer.compaction-interval": "10 s"})
    assert h.run([c("+I", 1, "a", None, pos=1)], now_ms=1_000) == []
    assert h.run([c("+I", 1, None, "b", pos=2)], now_ms=5_000) == []
    # next interval bucket: the key has no records but asked to be woken up
    out = h.run([], now_ms=10_000)
    assert kinds(out) == [("+I", (1, "a", "b"))]
    assert h.run([], now_ms=20_000) == []  # nothing pending any more
    h.run([c("+I", 1, "A", None, pos=3)], now_ms=21_000)
    h.run([c("+I", 1, "a", None, pos=4)], now_ms=22_000)  # back to what was emitted
    # without row-deduplicate the touched-but-unchanged row is re-emitted, as Paimon does
    assert kinds(h.run([], now_ms=30_000)) == [("-U", (1, "a", "b")), ("+U", (1, "a", "b"))]


def test_full_compaction_row_deduplicate_drops_round_trips():
    h = harness("k,a", {**FC, "changelog-producer.compaction-interval": "10 s",
                        "changelog-producer.row-deduplicate": "true"})
    h.run([c("+I", 1, "a", pos=1)], now_ms=0)
    assert kinds(h.run([], now_ms=10_000)) == [("+I", (1, "a"))]
    h.run([c("+I", 1, "A", pos=2)], now_ms=11_000)
    h.run([c("+I", 1, "a", pos=3)], now_ms=12_000)
    assert h.run([], now_ms=20_000) == []
    h.run([c("+I", 1, "b", pos=4)], now_ms=21_000)
    assert kinds(h.run([], now_ms=30_000)) == [("-U", (1, "a")), ("+U", (1, "b"))]


def test_full_compaction_delete_then_state_cleared():
    h = harness("k,a", {"changelog-producer": "full-compaction",
                        "changelog-producer.compaction-interval": "1 min"}, input_retracts=True)
    h.run([c("+I", 1, "a", pos=1)], now_ms=0)
    assert kinds(h.run([], now_ms=60_000)) == [("+I", (1, "a"))]
    h.run([c("-D", 1, "a", pos=2)], now_ms=61_000)
    assert 1 in {k[0] for k in h.state}  # the delete is pending, state kept
    assert kinds(h.run([], now_ms=120_000)) == [("-D", (1, "a"))]
    assert h.state == {}


def test_full_compaction_wakeup_time():
    h = harness("k,a", {"changelog-producer": "full-compaction",
                        "changelog-producer.compaction-interval": "10 s"})
    h.run([c("+I", 1, "a", pos=1)], now_ms=12_345)
    assert h.stage.wakeup_ms(h.state[(1,)]) == 20_000
