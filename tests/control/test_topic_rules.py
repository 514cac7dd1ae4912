"""Topic rules over compiled pipelines: each refusal names the table, the topic and the rule."""

from __future__ import annotations

import re

import pytest
from control_support import EXAMPLE_SQL

from tidemark.control.topic_rules import TopicRuleViolation, check_against_others, check_pipeline
from tidemark.engine.pipeline import compile_sql

REGISTRY = "tidemark.registry"


def with_topics(s1: str = "s1", s2: str = "s2", t1: str = "t1"):
    return compile_sql(EXAMPLE_SQL.replace("'topic' = 's1'", f"'topic' = '{s1}'")
                       .replace("'topic' = 's2'", f"'topic' = '{s2}'").replace("'topic' = 't1'", f"'topic' = '{t1}'"))


@pytest.mark.parametrize(("topics", "expected"), [
    ({"t1": ""}, ["table 't1' (sink)", "not a legal Kafka topic name"]),
    ({"s1": "a b"}, ["table 's1' (source)", "'a b'", "not a legal"]),
    ({"s2": "x" * 250}, ["table 's2' (source)", "1-249 characters"]),
    ({"t1": ".."}, ["table 't1'", "neither '.' nor '..'"]),
    ({"s1": "__consumer_offsets"}, ["table 's1' (source)", "internal topic"]),
    ({"t1": REGISTRY}, ["table 't1' (sink)", "registry topic"]),
    ({"s2": REGISTRY}, ["table 's2' (source)", "registry topic"]),
    ({"t1": "s2"}, ["table 't1' (sink)", "'s2'", "this pipeline's source (table 's2')"]),
])
def test_rules_about_one_pipeline(topics, expected):
    with pytest.raises(TopicRuleViolation) as err:
        check_pipeline(with_topics(**topics), REGISTRY)
    for part in expected:
        assert part in str(err.value)


def test_legal_topics_pass():
    check_pipeline(with_topics("orders.v1", "Cust_omers-2", "x" * 249), REGISTRY)


@pytest.mark.parametrize(("name", "sink", "others", "expected"), [
    ("b", "shared", {"a": "shared"}, "already the sink of pipeline 'a'"),
    ("b", "a.dlq", {"a": "out-a"}, "the dead-letter topic of pipeline 'a'"),
    ("b", "b.dlq", {}, "this pipeline's own dead-letter topic"),
    ("b", "out-b", {"a": "b.dlq"}, "its dead-letter topic 'b.dlq' is the sink of pipeline 'a'"),
])
def test_rules_against_the_other_pipelines(name, sink, others, expected):
    with pytest.raises(TopicRuleViolation, match=expected):
        check_against_others(name, with_topics(t1=sink), {o: with_topics(t1=t) for o, t in others.items()})


def test_reading_another_pipelines_sink_or_dead_letters_is_allowed():
    upstream = {"a": with_topics(t1="out-a")}
    check_against_others("b", with_topics(s1="out-a", s2="a.dlq", t1="out-b"), upstream)
    check_against_others("a", with_topics(t1="out-a"), upstream)  # itself is not "another"


def statement_set(t2: str):
    """The example with a second sink ``t2`` (topic ``t2``) in a statement set."""
    head, insert = EXAMPLE_SQL.split("INSERT INTO t1")
    return compile_sql(
        head + f"CREATE TABLE t2 (id BIGINT, level BIGINT, PRIMARY KEY (id) NOT ENFORCED) "
        f"WITH ('topic' = '{t2}', 'format' = 'upsert-json');\n"
        f"EXECUTE STATEMENT SET BEGIN INSERT INTO t1{insert.rstrip().rstrip(';')}; "
        "INSERT INTO t2 SELECT id, level FROM s1; END;"
    )


@pytest.mark.parametrize(("t2", "check", "expected"), [
    ("s2", lambda p: check_pipeline(p, REGISTRY), "table 't2' (sink): topic 's2' is also this pipeline's source"),
    ("shared", lambda p: check_against_others("b", p, {"a": with_topics(t1="shared")}),
     "table 't2' (sink): topic 'shared' is already the sink of pipeline 'a'"),
    ("t2", lambda p: check_against_others("a", with_topics(t1="t9"), {"b": p}), None),
    ("a.dlq", lambda p: check_against_others("a", with_topics(t1="t9"), {"b": p}),
     "its dead-letter topic 'a.dlq' is the sink of pipeline 'b'"),
])
def test_every_sink_of_a_statement_set_follows_the_rules(t2, check, expected):
    pipeline = statement_set(t2)
    if expected is None:
        check(pipeline)
        return
    with pytest.raises(TopicRuleViolation, match=re.escape(expected)):
        check(pipeline)
