"""``make demo`` (``python -m tidemark.cli.demo``): the seed's changelog-disorder example,
end to end on Kafka and Spark.

1. Starts the embedded Kafka-protocol broker (``tidemark.kafka.broker``).
2. Produces the seed's CDC events: s2 rows ``(10, 'a1')`` and ``(20, 'b1')``, and for s1 the
   change ``(id, level) = (k, 10) -> (k, 20)`` as its three changelog rows ``+I(k, 10)``,
   ``-U(k, 10)``, ``+U(k, 20)`` -- once per ordering of the seed (case 1 in order, cases 2
   and 3 out of order), case k on s1 id k. The three rows of a case sit in three different
   partitions of s1 (row i of every case in partition i), so nothing keeps them in order
   but the order they are read in.
3. Runs the join pipeline with ``tidemark run --until-idle --max-records-per-trigger 1``:
   one source record per micro-batch, so the sink really receives each case's rows in its
   disordered order, batch after batch (with larger batches the pair would cancel inside
   one batch, which is the normal, cheaper way).
4. Prints the sink topic's history and the table it materializes to: every id ends at
   ``(k, 20, 'b1')``, as the seed says it must.

Exit status 0 when the table is right, 1 otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path

DEMO_SQL = """\
-- The seed's join (changelog-disorder-and-sink-upsert-materializer), s1 as a changelog topic
-- so that the two halves of an update can travel (and arrive) separately.
CREATE TABLE s1 (id BIGINT, level BIGINT, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('topic' = '{s1}', 'format' = 'changelog-json');
CREATE TABLE s2 (id BIGINT, attr STRING, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('topic' = '{s2}', 'format' = 'debezium-json');
CREATE TABLE t1 (id BIGINT, level BIGINT, attr STRING, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('topic' = '{t1}', 'format' = 'upsert-json');
INSERT INTO t1 SELECT s1.id, s1.level, s2.attr FROM s1 JOIN s2 ON s1.level = s2.id
  ON CONFLICT DO DEDUPLICATE;
"""

#: the seed's three orderings of s1's changelog for "level 10 -> 20"
ORDERINGS: dict[int, tuple[str, ...]] = {
    1: ("+I", "-U", "+U"),  # in order
    2: ("+U", "+I", "-U"),  # out of order: the update's new row first, its retraction last
    3: ("+I", "+U", "-U"),  # out of order: the retraction after the new row
}
S1_ROWS = {"+I": 10, "-U": 10, "+U": 20}  # level of the row each kind carries
S2_ROWS = [(10, "a1"), (20, "b1")]
EXPECTED_ROW = (20, "b1")


def s2_records(topic: str) -> list[tuple[str, int, bytes, bytes]]:
    """The s2 inserts as Debezium records: (topic, partition, key, value)."""
    out = []
    for ts, (id_, attr) in enumerate(S2_ROWS, 1):
        value = {"before": None, "after": {"id": id_, "attr": attr}, "op": "c", "ts_ms": ts}
        out.append((topic, 0, json.dumps({"id": id_}).encode(), json.dumps(value).encode()))
    return out


def s1_case_records(topic: str, case: int, id_: int) -> list[tuple[str, int, bytes, bytes]]:
    """One ordering of s1's changelog for ``id_``: kind i of the case goes to partition i."""
    out = []
    for partition, kind in enumerate(ORDERINGS[case]):
        value = {"op": kind, "id": id_, "level": S1_ROWS[kind]}
        out.append((topic, partition, json.dumps({"id": id_}).encode(), json.dumps(value).encode()))
    return out


def produce_in_transactions(bootstrap: str, records: Iterable[tuple[str, int, bytes | None, bytes | None]]) -> None:
    """Each record in its own committed Kafka transaction, in the given order (a commit
    marker then follows every record: a rate limit of one offset per batch reads it as a
    batch of its own)."""
    from confluent_kafka import Producer

    producer = Producer({
        "bootstrap.servers": bootstrap, "transactional.id": f"tidemark-demo-{uuid.uuid4().hex[:8]}",
        "enable.idempotence": True, "log_level": 3,
    })
    producer.init_transactions(30)
    for topic, partition, key, value in records:
        producer.begin_transaction()
        producer.produce(topic, key=key, value=value, partition=partition)
        producer.commit_transaction(30)
    producer.flush(30)


def produce_records(bootstrap: str, records: Iterable[tuple[str, int, bytes | None, bytes | None]]) -> None:
    """Produce to the given partitions, in order."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "log_level": 3})
    for topic, partition, key, value in records:
        producer.produce(topic, key=key, value=value, partition=partition)
    if producer.flush(30):
        raise RuntimeError(f"could not deliver the demo records to {bootstrap}")


def sink_history(bootstrap: str, topic: str) -> list[tuple[int, tuple | None]]:
    """The sink topic's records in order: (id, (level, attr)) or (id, None) for a tombstone."""
    from tidemark.kafka.read import read_topic

    out = []
    for r in read_topic(bootstrap, topic):
        key = json.loads(r.key)["id"]
        if r.value is None:
            out.append((key, None))
        else:
            row = json.loads(r.value)
            out.append((key, (row["level"], row["attr"])))
    return out


def table_text(columns: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(c) for c in columns]] + [["NULL" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    fmt = lambda r: "| " + " | ".join(v.ljust(w) for v, w in zip(r, widths)) + " |"  # noqa: E731
    return "\n".join([line, fmt(cells[0]), line, *map(fmt, cells[1:]), line])


def tidemark_command() -> list[str]:
    script = Path(sys.executable).parent / "tidemark"
    return [str(script)] if script.exists() else [sys.executable, "-m", "tidemark.cli.main"]


def main() -> int:
    from tidemark.kafka.admin import ensure_topics
    from tidemark.kafka.broker import EmbeddedBroker, configured_bootstrap

    say = lambda text="": print(text, flush=True)  # noqa: E731
    with EmbeddedBroker() if configured_bootstrap() is None else _Existing() as broker:
        bootstrap = broker.bootstrap_servers
        say(f"broker: {broker.kind} at {bootstrap}")
        run = uuid.uuid4().hex[:6]
        # rate-limited batches drain partitions in sorted topic order: s2's rows sort first,
        # so they are in the join's state before s1's changes arrive one batch at a time
        topics = {"s1": f"demo-{run}-1-s1", "s2": f"demo-{run}-0-s2", "t1": f"demo-{run}-t1"}
        ensure_topics(bootstrap, {topics["s1"]: 3, topics["s2"]: 1})
        records = s2_records(topics["s2"])
        for case in ORDERINGS:
            records += s1_case_records(topics["s1"], case, id_=case)
        say(f"producing {len(records)} CDC records:")
        say("  s2: +I(10, 'a1'), +I(20, 'b1')")
        for case, kinds in ORDERINGS.items():
            shown = ", ".join(f"{k}({case}, {S1_ROWS[k]})" for k in kinds)
            say(f"  s1 case {case} ({'in order' if case == 1 else 'out of order'}): {shown}  [partitions 0, 1, 2]")
        produce_records(bootstrap, records)

        work = Path(tempfile.mkdtemp(prefix="tidemark-demo-"))
        sql_file = work / "s1_s2_join.sql"
        sql_file.write_text(DEMO_SQL.format(**topics), encoding="utf-8")
        cmd = [*tidemark_command(), "run", str(sql_file), "--bootstrap-servers", bootstrap,
               "--checkpoint", str(work / "checkpoint"), "--until-idle", "--max-records-per-trigger", "1",
               "--name", f"demo-{run}"]
        say("\n$ tidemark run s1_s2_join.sql --bootstrap-servers ... --until-idle --max-records-per-trigger 1")
        started = time.monotonic()
        env = dict(os.environ)
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        status = subprocess.run(cmd, env=env, check=False).returncode
        say(f"(exit status {status}, {time.monotonic() - started:.0f}s)")
        if status != 0:
            return 1

        history = sink_history(bootstrap, topics["t1"])
        say(f"\nsink topic {topics['t1']}, every record in order (key id -> value; tombstone = delete):")
        say(table_text(["offset", "id", "level", "attr"],
                       [(i, k, *(v if v else ("(tombstone)", ""))) for i, (k, v) in enumerate(history)]))
        table: dict[int, tuple] = {}
        for k, v in history:
            if v is None:
                table.pop(k, None)
            else:
                table[k] = v
        say("\nsink table t1 (the topic materialized: last value per key):")
        say(table_text(["id", "level", "attr"], [(k, *table[k]) for k in sorted(table)]))
        expected = {case: EXPECTED_ROW for case in ORDERINGS}
        if table != expected:
            say(f"\nWRONG: expected every id to end at {EXPECTED_ROW}")
            return 1
        say("\nall three orderings end at (id, 20, 'b1'), as a changelog-correct join must.")
        return 0


class _Existing:
    """A broker given by $KAFKA_BOOTSTRAP_SERVERS, with EmbeddedBroker's interface."""

    kind = "external"

    def __enter__(self) -> _Existing:
        from tidemark.kafka.broker import configured_bootstrap

        self.bootstrap_servers = configured_bootstrap()
        return self

    def __exit__(self, *exc: object) -> None:
        pass


if __name__ == "__main__":
    sys.exit(main())
