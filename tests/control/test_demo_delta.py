"""The delta-join part of ``make demo``: its SQL plans as a delta join, its records decode
with the tables' own formats, and the engine (ReplayHost, the same stages the job runs)
ends at the table the demo expects -- so a demo failure is the runtime's, not the script's."""

from __future__ import annotations

import pytest

from tidemark.control import demo_delta
from tidemark.engine.pipeline import compile_sql
from tidemark.engine.replay import ReplayHost
from tidemark.formats import decoder_for
from tidemark.index_client.pipeline_tables import indexed_tables

TOPICS = demo_delta.topics("t")


def decoded(pipeline, late: bool = False) -> list[tuple[str, list]]:
    by_topic = {t.options["topic"]: t for t in pipeline.sources.values()}
    out = []
    first = 100 if late else 0
    for offset, (topic, partition, key, value) in enumerate(demo_delta.records(TOPICS, late=late), first):
        table = by_topic[topic]
        out.append((table.name, decoder_for(table).decode(key, value, (partition, offset), topic)))
    return out


def test_the_demo_pipeline_is_a_delta_join_over_both_tables():
    pipeline = compile_sql(demo_delta.SQL.format(**TOPICS))
    assert [t.name for t in indexed_tables(pipeline)] == ["orders", "customers"]
    assert "delta join" in pipeline.explain_text()


def run(host: ReplayHost, batches: list[list[tuple[str, list]]]) -> dict:
    for batch in batches:
        inputs: dict[str, list] = {}
        for table, changes in batch:
            inputs.setdefault(table, []).extend(changes)
        host.run_batch(inputs)
    return {(row[0], row[1]): (row[2], row[3]) for row in host.table().values()}


@pytest.mark.parametrize("per_record", [False, True], ids=["one batch", "a batch per record"])
def test_the_demo_records_end_at_the_expected_tables(per_record):
    pipeline = compile_sql(demo_delta.SQL.format(**TOPICS))
    host = ReplayHost(pipeline)
    records = decoded(pipeline)
    assert run(host, [[r] for r in records] if per_record else [records]) == demo_delta.EXPECTED
    assert run(host, [decoded(pipeline, late=True)]) == demo_delta.EXPECTED_FINAL
