"""Lookup joins (``FOR SYSTEM_TIME AS OF`` a processing-time attribute): what the planner
accepts and refuses, and what the replay host computes (each stream change joined with the
dimension as of its batch's start; later dimension changes never revise earlier results)."""

from __future__ import annotations

import pickle

import pytest

from tidemark.engine.changelog import Change
from tidemark.engine.errors import SqlError
from tidemark.engine.expressions import col_ref
from tidemark.engine.pipeline import compile_sql
from tidemark.engine.replay import ReplayHost
from tidemark.engine.stage import BatchContext
from tidemark.engine.stages.lookup_join import LookupJoin
from tidemark.index_client.pipeline_tables import indexed_tables

DDL = """CREATE TABLE bid (auction BIGINT, price BIGINT, pt AS PROCTIME()) WITH ('topic' = 'bid', 'format' = 'json');
CREATE TABLE cdc (id BIGINT, auction BIGINT, ts TIMESTAMP(3), PRIMARY KEY (id) NOT ENFORCED) WITH ('topic' = 'cdc', 'format' = 'debezium-json');
CREATE TABLE side_input (key BIGINT, v STRING, PRIMARY KEY (key) NOT ENFORCED) WITH ('topic' = 'side', 'format' = 'upsert-json');
CREATE TABLE nokey (key BIGINT, v STRING) WITH ('topic' = 'nokey', 'format' = 'json');
CREATE TABLE out1 (auction BIGINT, price BIGINT, v STRING) WITH ('topic' = 'o', 'format' = 'changelog-json');
"""  # queries start on line 6

Q13 = ("INSERT INTO out1 SELECT B.auction, B.price, S.v FROM bid B\n"
       "JOIN side_input FOR SYSTEM_TIME AS OF B.pt AS S ON MOD(B.auction, 10) = S.key")


def _run(sql: str, batches: list[dict]) -> list[list[Change]]:
    host = ReplayHost(compile_sql(DDL + sql))
    return [host.run_batch(b, now_ms=i) for i, b in enumerate(batches)]


def test_each_row_sees_the_dimension_as_of_its_batch_and_is_never_revised():
    out = _run(Q13, [
        {"side_input": [Change("+I", (1, "one"), (1,)), Change("+I", (2, "two"), (2,))]},
        # a dimension change in the batch of the row is not seen by it...
        {"bid": [Change("+I", (11, 100), (3,)), Change("+I", (13, 50), (4,))],
         "side_input": [Change("+U", (1, "uno"), (5,))]},
        # ... but by the next batch's rows; and the earlier result stays as it was
        {"bid": [Change("+I", (21, 7), (6,))]},
    ])
    assert out == [[], [Change("+I", (11, 100, "one"), (3,))], [Change("+I", (21, 7, "uno"), (6,))]]


def test_left_join_pads_rows_without_a_dimension_row_and_null_keys_match_nothing():
    sql = Q13.replace("JOIN side_input", "LEFT JOIN side_input")
    out = _run(sql, [
        {"side_input": [Change("+I", (1, "one"), (1,))]},
        {"bid": [Change("+I", (11, 1), (2,)), Change("+I", (12, 2), (3,)), Change("+I", (None, 3), (4,))]},
    ])
    assert sorted(out[1], key=lambda c: c.pos) == [
        Change("+I", (11, 1, "one"), (2,)), Change("+I", (12, 2, None), (3,)), Change("+I", (None, 3, None), (4,))]


def test_a_deleted_dimension_row_stops_matching_and_stream_retractions_keep_their_kind():
    stage = LookupJoin("inner", [col_ref(1)], (0,), 2, table="side_input")
    ctx = BatchContext()
    state, out = stage.process_key((1,), [[], [Change("+I", (1, "one"), (1,))]], None, ctx)
    assert out == [] and state == {(1, "one"): 1}
    state, out = stage.process_key((1,), [[Change("+I", (7, 1), (2,))], [Change("-D", (1, "one"), (3,))]], state, ctx)
    assert out == [Change("+I", (7, 1, 1, "one"), (2,))] and state is None
    state, out = stage.process_key((1,), [[Change("-D", (7, 1), (4,))], []], state, ctx)
    assert out == [] and state is None  # the dimension row is gone: nothing to retract (as in Flink)
    assert ctx.metrics["lookup_join.side_input.lookups"] == 2


def test_the_stage_survives_pickling_with_its_key_expressions():
    pipeline = compile_sql(DDL + Q13)
    [node] = [n for n in pipeline.nodes if n.kind == "lookup_join"]
    stage = pickle.loads(pickle.dumps(node.stage))
    assert stage.key_of(Change("+I", (23, 5), ()), 0) == (3,)
    assert stage.key_of(Change("+I", (3, "x"), ()), 1) == (3,)


def test_plan_shows_the_lookup_join_with_its_keys_and_the_stream_mode():
    p = compile_sql(DDL + Q13)
    [node] = [n for n in p.nodes if n.kind == "lookup_join"]
    assert [p.node(i).kind for i in node.inputs] == ["source", "normalize"]
    assert node.changelog_mode == "append"
    assert "lookup_join inner side_input (FOR SYSTEM_TIME AS OF processing time)" in p.explain_text()
    assert "on: `auction` % 10 = key" in p.explain_text()
    assert "dimension rows: index side_input.PRIMARY (Spark: the index service)" in p.explain_text()
    assert [(t.name, t.history) for t in indexed_tables(p)] == [("side_input", True)]
    from tidemark.spark.delta import delta_joins

    assert delta_joins(p) == [node.stage]  # the Spark job hosts it against the index service


def test_without_an_index_the_join_key_covers_the_dimension_stays_in_state():
    p = compile_sql(DDL + Q13.replace("= S.key", "= S.key + 0").replace("MOD(B.auction, 10) = S.key + 0",
                                                                        "CAST(B.auction AS STRING) = S.v"))
    [node] = [n for n in p.nodes if n.kind == "lookup_join"]
    assert node.stage.index is None and indexed_tables(p) == []
    assert "dimension rows: state" in p.explain_text()
    with pytest.raises(Exception, match="covers no index of table 'side_input'"):
        node.stage.bind(lambda *a, **k: [])


def test_upsert_keys_follow_the_join_rule():
    sql = ("CREATE TABLE o2 (id BIGINT, auction BIGINT, v STRING, PRIMARY KEY (id) NOT ENFORCED) "
           "WITH ('topic' = 'o2', 'format' = 'upsert-json');\n"
           "INSERT INTO o2 SELECT c.id, c.auction, S.v FROM (SELECT id, auction, PT FROM cdc) c "
           "JOIN side_input FOR SYSTEM_TIME AS OF c.PT AS S ON c.id = S.key")
    ddl = DDL.replace("ts TIMESTAMP(3),", "ts TIMESTAMP(3), PT AS PROCTIME(),")
    with pytest.raises(SqlError, match="unknown column 'PT'"):  # an attribute, not a column
        compile_sql(ddl + sql)
    sql = sql.replace("(SELECT id, auction, PT FROM cdc) c", "cdc c")
    p = compile_sql(ddl + sql)
    [node] = [n for n in p.nodes if n.kind == "lookup_join"]
    assert node.upsert_key == (0,)  # the stream's key (it holds the join key; the dimension is unique on it)
    assert p.materializer is None


@pytest.mark.parametrize(
    "query, message, col",
    [
        ("INSERT INTO out1 SELECT c.auction, c.id, S.v FROM cdc c\nJOIN side_input FOR SYSTEM_TIME AS OF c.ts AS S ON c.auction = S.key",
         "side_input FOR SYSTEM_TIME AS OF ... (a temporal join) is not supported yet on event time: c.ts is not a processing-time attribute", 39),
        ("INSERT INTO out1 SELECT B.auction, B.price, S.v FROM bid B\nRIGHT JOIN side_input FOR SYSTEM_TIME AS OF B.pt AS S ON B.auction = S.key",
         "RIGHT JOIN ... FOR SYSTEM_TIME AS OF is not supported: a lookup join is INNER or LEFT", None),
        ("INSERT INTO out1 SELECT B.auction, B.price, S.v FROM bid B\nJOIN nokey FOR SYSTEM_TIME AS OF B.pt AS S ON B.auction = S.key",
         "lookup join: table 'nokey' has no PRIMARY KEY", 6),
        ("INSERT INTO out1 SELECT B.auction, B.price, S.v FROM bid B\nJOIN side_input FOR SYSTEM_TIME AS OF B.pt AS S ON B.auction > S.key",
         "lookup join condition B.auction > S.key has no equality between a column of 'side_input' and an expression of the stream", None),
    ],
)
def test_refusals_name_the_construct_and_its_position(query, message, col):
    with pytest.raises(SqlError) as info:
        compile_sql(DDL + query)
    assert message in str(info.value)
    assert info.value.line == 7, str(info.value)
    if col is not None:
        assert info.value.col == col, str(info.value)


def _random_batches(seed: int) -> list[dict]:
    """Batches of bids and side-input upserts (updates and deletes), values colliding."""
    import random

    rng = random.Random(seed)
    pos, side, out = 0, {}, []
    for _ in range(6):
        batch: dict[str, list[Change]] = {"bid": [], "side_input": []}
        for _ in range(rng.randint(1, 8)):
            pos += 1
            if rng.random() < 0.4:
                key = rng.randint(0, 4)
                if key in side and rng.random() < 0.3:
                    batch["side_input"].append(Change("-D", (key, side.pop(key)), (pos,)))
                else:
                    side[key] = rng.choice(["a", "b", "c"])
                    batch["side_input"].append(Change("+U", (key, side[key]), (pos,)))
            else:
                batch["bid"].append(Change("+I", (rng.choice([None, *range(20)]), rng.randint(1, 9)), (pos,)))
        out.append(batch)
    return out


@pytest.mark.parametrize("seed", range(8))
def test_bound_to_an_index_it_computes_what_it_computes_with_state(seed):
    """The index service's store (``TableIndex``, fed as the service feeds it), asked as of
    each batch's start offsets, gives the same output as the dimension kept in state."""
    from tidemark.engine.pipeline import compile_sql as plan
    from tidemark.index_client.local import LocalLookup, index_for

    sql = DDL + Q13.replace("JOIN side_input", "LEFT JOIN side_input") + " AND S.v <> 'c'"
    batches = _random_batches(seed)
    host = ReplayHost(plan(sql))
    expected = [sorted(host.run_batch(b, now_ms=i), key=repr) for i, b in enumerate(batches)]
    pipeline = plan(sql)
    [node] = [n for n in pipeline.nodes if n.kind == "lookup_join"]
    [normalize] = [n for n in pipeline.nodes if n.kind == "normalize"]
    lookup = LocalLookup({"side_input": index_for(pipeline.sources["side_input"])})
    stage = pickle.loads(pickle.dumps(node.stage)).bind(lookup)  # as a Spark task gets it
    got = []
    for i, b in enumerate(batches):
        start = lookup.offsets("side_input")
        end = lookup.feed("side_input", b["side_input"])  # the service may already be past the batch
        stage.begin_batch(i, {"side_input": (start, end)})
        joined = stage.process_batch([b["bid"], []], BatchContext(batch_id=i))
        got.append(sorted(_sink_rows(pipeline, node, joined), key=repr))
    assert got == expected
    assert node.stage.index == ("PRIMARY", (0,)) and normalize.id in node.inputs


def _sink_rows(pipeline, node, changes):
    """The lookup join's output through the stages after it (the projection to the sink)."""
    from tidemark.engine.stage import run_stateless

    for n in pipeline.nodes[node.id + 1:]:
        if n.kind == "sink":
            return changes
        changes = run_stateless(n.stage, [changes])
    return changes


def test_a_subquerys_proctime_item_is_its_processing_time_attribute_as_q13_writes_it():
    q13_form = ("INSERT INTO out1 SELECT c.auction, c.id, S.v FROM (SELECT *, PROCTIME() AS p FROM cdc) c\n"
                "JOIN side_input FOR SYSTEM_TIME AS OF c.p AS S ON c.auction = S.key")
    out = _run(q13_form, [{"side_input": [Change("+I", (5, "five"), (1,))]},
                          {"cdc": [Change("+I", (1, 5, None), (2,)), Change("+I", (2, 6, None), (3,))]}])
    assert out[1] == [Change("+I", (5, 1, "five"), (2,))]
    with pytest.raises(SqlError, match="unknown column 'p'"):  # an attribute, not a column
        compile_sql(DDL + q13_form.replace("SELECT c.auction, c.id,", "SELECT c.auction, c.p,"))
