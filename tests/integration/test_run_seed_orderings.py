"""The seed's changelog-disorder example through Kafka and Spark, in all three orderings.

s2 holds ``(10, 'a1')`` and ``(20, 'b1')``; s1's row 1 moves from level 10 to 20, i.e. the
changelog rows ``+I(1, 10)``, ``-U(1, 10)``, ``+U(1, 20)``. Each ordering of the seed is
produced with every row in its own Kafka transaction and its own partition of s1, and the
job runs a micro-batch after each row, so the join and the sink materializer really see
the rows one batch at a time in the disordered order (in one batch they would cancel
before reaching the sink: see the last test). Whatever the order, the sink topic must materialize to
``{(1, 20, 'b1')}``; on the way, its history shows what each ordering did, and it must be
exactly what the in-process replay host produces for the same batches.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from run_support import produce, replay_reference, sink_changes, sink_records, sink_table, unique_topics

from tidemark.cli.demo import DEMO_SQL, ORDERINGS, s1_case_records, s2_records
from tidemark.engine.pipeline import compile_sql
from tidemark.kafka.admin import ensure_topics
from tidemark.spark.job import PipelineJob, run_pipeline

pytestmark = pytest.mark.integration

A1, B1 = (1, 10, "a1"), (1, 20, "b1")
#: what the upsert sink topic receives, record by record, when each row is its own batch
HISTORY = {
    1: [A1, None, B1],  # in order: the retraction empties the key (tombstone), then the new row
    2: [B1, A1, B1],  # the new row first; the old row is later so it wins; its retraction rolls back
    3: [A1, B1],  # the retraction of a row that is no longer the latest changes nothing
}


def run_ordering(spark, bootstrap: str, tmp_path, case: int) -> None:
    sql, topics = unique_topics(DEMO_SQL.format(s1="s1", s2="s2", t1="t1"), f"case{case}")
    pipeline = compile_sql(sql)
    ensure_topics(bootstrap, {topics["s1"]: 3, topics["s2"]: 1})
    job = PipelineJob(
        spark, pipeline, bootstrap, str(tmp_path / f"case{case}" / "checkpoint"), name=f"seed-case{case}",
        trigger_interval="100 milliseconds",
    )
    try:
        # s2 first (its rows are in the join state before s1 changes), then s1's rows in
        # the case's order: kind i in partition i, each in its own transaction, a batch each
        produce(bootstrap, topics["s2"], [(k, v) for _, _, k, v in s2_records(topics["s2"])], transactional=True)
        job.start()
        job.process_all_available()
        for _, partition, key, value in s1_case_records(topics["s1"], case, id_=1):
            produce(bootstrap, topics["s1"], [(key, value)], partition_of=lambda _k, p=partition: p,
                    transactional=True)
            job.process_all_available()
    finally:
        job.close()

    assert sink_table(bootstrap, pipeline) == {(1,): B1}
    history = [c.row if c.kind != "-D" else None for c in sink_changes(pipeline, sink_records(bootstrap, pipeline))]
    assert history == HISTORY[case]
    # s2 in one batch, then every s1 row in a batch of its own
    assert [r.rows_in for r in job.reports] == [2, 1, 1, 1]
    assert replay_reference(bootstrap, pipeline, job.reports).table() == {(1,): B1}


def test_every_ordering_ends_at_the_seed_answer(spark, kafka_bootstrap, tmp_path):
    """The three orderings run at once, each its own pipeline, topics and query (a batch's
    fixed cost is mostly waiting, so they overlap); every one must pass on its own."""
    failures: dict[int, str] = {}

    def one(case: int) -> None:
        try:
            run_ordering(spark, kafka_bootstrap, tmp_path, case)
        except Exception as err:  # collected, so every ordering reports
            failures[case] = f"{type(err).__name__}: {err}"

    with ThreadPoolExecutor(len(ORDERINGS)) as pool:
        list(pool.map(one, sorted(ORDERINGS)))
    assert not failures, "\n".join(f"case {c}: {m}" for c, m in sorted(failures.items()))


def test_all_orderings_in_one_batch_write_only_the_answer(spark, kafka_bootstrap, tmp_path):
    """The normal case: the three rows of a change arrive in one micro-batch (the barrier),
    in any order and any partitions; the pair cancels inside the batch and the sink gets
    one record per id, the answer, without intermediate flicker. Case k on s1 id k."""
    sql, topics = unique_topics(DEMO_SQL.format(s1="s1", s2="s2", t1="t1"), "onebatch")
    pipeline = compile_sql(sql)
    ensure_topics(kafka_bootstrap, {topics["s1"]: 3, topics["s2"]: 1})
    produce(kafka_bootstrap, topics["s2"], [(k, v) for _, _, k, v in s2_records(topics["s2"])], transactional=True)
    for case in sorted(ORDERINGS):
        for _, partition, key, value in s1_case_records(topics["s1"], case, id_=case):
            produce(kafka_bootstrap, topics["s1"], [(key, value)], partition_of=lambda _k, p=partition: p,
                    transactional=True)
    result = run_pipeline(spark, pipeline, kafka_bootstrap, str(tmp_path / "checkpoint"), name="seed-onebatch")

    assert [r.rows_in for r in result.reports] == [11]
    expected = {(k,): (k, 20, "b1") for k in ORDERINGS}
    assert sink_table(kafka_bootstrap, pipeline) == expected
    assert len(sink_records(kafka_bootstrap, pipeline)) == 3  # one record per id: no flicker
    assert replay_reference(kafka_bootstrap, pipeline, result.reports).table() == expected
