"""Keyed stages on one key run on Spark as one keyed operator (``tidemark.engine.fusion``)
and give the replay host's table on the job's own batches, across a restart: each member
keeps its own state in the one operator's store. The shape here is an upsert source joined
on its primary key (normalize, then the join); the aggregate joined on its group key runs in
the replay == Spark slice (``test_run_replay_equivalence``, the ``inventory`` shape)."""

from __future__ import annotations

import random

import pytest
from run_support import PartRunner, replay_reference, sink_table, unique_topics

from tidemark.engine.fusion import fused_pairs
from tidemark.engine.pipeline import compile_sql

pytestmark = pytest.mark.integration

SQL = """
CREATE TABLE prices (id BIGINT, price BIGINT, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('topic' = 'prices', 'format' = 'upsert-json');
CREATE TABLE names (id BIGINT, name STRING, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('topic' = 'names', 'format' = 'debezium-json');
CREATE TABLE priced (name STRING, price BIGINT, PRIMARY KEY (name) NOT ENFORCED)
  WITH ('topic' = 'priced', 'format' = 'upsert-json');
INSERT INTO priced SELECT n.name, p.price FROM prices p JOIN names n ON p.id = n.id ON CONFLICT DO DEDUPLICATE;
"""


def _changes(rng: random.Random, table: dict[int, dict], ids: int, make) -> list[dict]:
    """Inserts, updates (a -U/+U pair) and deletes of ``table``'s rows, ``table`` kept current."""
    out = []
    for key in rng.sample(range(ids), ids // 2):
        row = {"id": key, **make(rng)}
        if key not in table:
            out.append({"kind": "+I", "row": row})
            table[key] = row
        elif rng.random() < 0.3:
            out.append({"kind": "-D", "row": table.pop(key)})
        else:
            out += [{"kind": "-U", "row": table[key]}, {"kind": "+U", "row": row}]
            table[key] = row
    return out


def test_normalize_and_the_join_on_its_key_give_replays_table_across_a_restart(spark, kafka_bootstrap, tmp_path):
    sql, _ = unique_topics(SQL, "fused")
    pipeline = compile_sql(sql)
    assert [(pipeline.node(a).kind, pipeline.node(b).kind) for a, (b, _) in fused_pairs(pipeline).items()] \
        == [("normalize", "join")]
    rng, prices, names = random.Random(7), {}, {}

    def part() -> dict[str, list[dict]]:
        return {"prices": _changes(rng, prices, 60, lambda r: {"price": r.randrange(100)}),
                "names": _changes(rng, names, 60, lambda r: {"name": f"n{r.randrange(20)}"})}

    checkpoint = tmp_path / "checkpoint"
    parts = PartRunner(spark, kafka_bootstrap, pipeline, str(checkpoint), "fused")
    first = parts.run(part())
    second = parts.run(part())
    reports = first.reports + second.reports
    assert len(first.reports) >= 2 and len(second.reports) >= 2, "several micro-batches on each side of the restart"

    expected = replay_reference(kafka_bootstrap, pipeline, reports).table()
    assert expected, "joined rows"
    assert sink_table(kafka_bootstrap, pipeline, second.sink_writer_id) == expected
    # one state store for the fused normalize and join, one for the materializer
    assert len([d for d in (checkpoint / "state").iterdir() if d.is_dir()]) == 2
