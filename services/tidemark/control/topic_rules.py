"""Which Kafka topics a pipeline may read and write, checked when it is registered.

A pipeline's topics are its source tables' and its sink tables' ``'topic'`` option (the
table's name when absent, as the job reads it); its dead letters go to ``<pipeline>.dlq``.
``check_pipeline`` holds the rules about one pipeline alone; ``check_against_others`` the
ones that need every other registered pipeline. Each refusal is a ``TopicRuleViolation``
whose message names the table, the topic and the rule.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

from tidemark.formats.dead_letter import dlq_topic

if TYPE_CHECKING:
    from tidemark.engine.catalog import TableDef
    from tidemark.engine.pipeline import Pipeline

# Kafka's own rule for topic names (kafka.common.internals.Topic)
LEGAL_TOPIC = re.compile(r"[a-zA-Z0-9._-]{1,249}")


class TopicRuleViolation(ValueError):
    """The message is shown to the user as is."""


def table_topic(table: TableDef) -> str:
    return table.options.get("topic", table.name)


def check_pipeline(pipeline: Pipeline, registry_topic: str) -> None:
    """Legal names, no internal topic, not the registry topic, a sink that is not a source."""
    sinks = [t.table for t in pipeline.sinks]
    for table in [*pipeline.sources.values(), *sinks]:
        topic = table_topic(table)
        role = "sink" if any(table is s for s in sinks) else "source"
        where = f"table '{table.name}' ({role}): topic {topic!r}"
        if not LEGAL_TOPIC.fullmatch(topic) or topic in (".", ".."):
            raise TopicRuleViolation(f"{where} is not a legal Kafka topic name: 1-249 characters of "
                                     "a-z, A-Z, 0-9, '.', '_' and '-', and neither '.' nor '..'")
        if topic.startswith("__"):
            raise TopicRuleViolation(f"{where} is an internal topic: names starting with '__' belong to "
                                     "Kafka itself (e.g. __consumer_offsets)")
        if topic == registry_topic:
            raise TopicRuleViolation(f"{where} is the control service's registry topic; "
                                     "a pipeline may neither read nor write it")
    for sink in sinks:
        sink_topic = table_topic(sink)
        for table in pipeline.sources.values():
            if table_topic(table) == sink_topic:
                raise TopicRuleViolation(f"table '{sink.name}' (sink): topic {sink_topic!r} is also "
                                         f"this pipeline's source (table '{table.name}'); a sink must not "
                                         "feed its own input")


def check_against_others(name: str, pipeline: Pipeline, others: Mapping[str, Pipeline]) -> None:
    """A topic gets one writer: the sink is no other pipeline's sink or dead-letter topic
    (nor this pipeline's own dead-letter topic), and this pipeline's dead-letter topic is
    no other pipeline's sink (every sink of a statement set counts)."""
    for target in pipeline.sinks:
        sink = target.table
        sink_topic = table_topic(sink)
        where = f"table '{sink.name}' (sink): topic {sink_topic!r}"
        if sink_topic == dlq_topic(name):
            raise TopicRuleViolation(f"{where} is this pipeline's own dead-letter topic")
        for other, other_pipeline in sorted(others.items()):
            if other == name:
                continue
            if sink_topic in {table_topic(t.table) for t in other_pipeline.sinks}:
                raise TopicRuleViolation(f"{where} is already the sink of pipeline '{other}'; "
                                         "two pipelines must not write one topic")
            if sink_topic == dlq_topic(other):
                raise TopicRuleViolation(f"{where} is the dead-letter topic of pipeline '{other}'")
    for other, other_pipeline in sorted(others.items()):
        if other != name and dlq_topic(name) in {table_topic(t.table) for t in other_pipeline.sinks}:
            raise TopicRuleViolation(f"pipeline '{name}': its dead-letter topic {dlq_topic(name)!r} is the sink "
                                     f"of pipeline '{other}'; choose another pipeline name")
