"""The Nexmark queries as benchmark workloads: the suite (``suite.py``) runs them like its own
W1-W4, Tidemark on Spark vs Flink 2.3 on the same generated events.

``generate("NX-q4", scale, seed, out_dir)`` writes the seeded generator's events
(``tests/nexmark/generator.py``, ``EVENTS_PER_SCALE`` per unit of scale, in order, no
jitter) as one JSON file per source table and returns a ``workloads.Workload`` whose Tidemark
SQL is the query as adapted (``tests/nexmark/queries``: Kafka topics), its sources read bounded
as the Spark test reads them (``spark_host.bounded``: the windows still open at the end fire,
as Flink's at the end of its files), and whose Flink SQL is
the same text with each source's ``WITH`` clause pointed at its file (filesystem connector,
WATERMARK kept) and the sink's at the suite's measuring sink.

Only the queries that equal Flink 2.3 on the Spark host are workloads
(``expected_status.SPARK_STATUS``), q13 aside (``NOT_COMPARABLE``). The generator computes no final table (``expected`` is
None), so a Nexmark run's table is compared with Flink's only, and only where the sink has a
primary key: both systems' measuring sinks keep a table by the sink's key, which a keyless
sink (an append-only result) has not; the Spark test (``tests/nexmark/test_nexmark_spark.py``)
compares those.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
NEXMARK = HERE.parent / "nexmark"
sys.path.insert(0, str(NEXMARK))
import expected_status  # noqa: E402  (tests/nexmark modules, not a package)
import generator  # noqa: E402
import harness  # noqa: E402
import spark_host  # noqa: E402
import workloads  # noqa: E402

# q14's UDF module is imported by Flink's and Spark's Python workers, which the suite starts
# after this import: they inherit this path
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(NEXMARK), os.environ.get("PYTHONPATH")]))

PREFIX = "NX-"
#: generated events per unit of the suite's ``--scale`` (make bench's 4.0: 200,000 events)
EVENTS_PER_SCALE = 50_000
MIN_EVENTS = 1_000
#: q13's lookup join is a regular join on Flink's file sources (``harness.oracle_sql``), so the
#: two systems would run different operators: not a workload
NOT_COMPARABLE = {"q13"}
NAMES = tuple(f"{PREFIX}{q}" for q in harness.QUERY_NAMES
              if expected_status.SPARK_STATUS[q] == "equal" and q not in NOT_COMPARABLE)
#: a whole-line comment: the runner splits statements at ";" + newline, which q2's comments hold
_COMMENT_LINE = re.compile(r"^[ \t]*--[^\n]*\n", re.M)
_TABLE = re.compile(r"(CREATE TABLE\s+(\w+)\s*\(.*?\)\s*WITH\s*\()([^)]*)(\))", re.S | re.I)


@dataclass
class NexmarkWorkload(workloads.Workload):
    """A Nexmark query as a suite workload; its Flink SQL is the adapted query's text.
    ``declared`` holds a file for every table the query's DDL declares (``tables`` only the
    ones it reads, which are produced and counted)."""

    query_sql: str = ""
    declared: dict[str, Path] = field(default_factory=dict)

    def flink_sql(self, paths: dict[str, Path] | None = None,
                  sink_options: dict[str, str] | None = None) -> str:
        paths = {**self.declared, **(paths or self.tables)}
        sink_options = sink_options or {"connector": "blackhole"}

        def with_clause(m: re.Match) -> str:
            name = m.group(2)
            if name == self.sink:
                # the measuring sink keeps a table by the sink's key: a keyless sink counts
                opts = sink_options if self.sink_pk else {**sink_options, "materialize": "false"}
            else:
                opts = {"connector": "filesystem", "path": str(paths[name]), "format": "json"}
            return m.group(1) + workloads._with(opts) + m.group(4)

        return _TABLE.sub(with_clause, _COMMENT_LINE.sub("", harness.oracle_sql(self.query_sql)))


def _write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def generate(name: str, scale: float, seed: int, out_dir: Path) -> NexmarkWorkload:
    """Workload ``name`` (one of ``NAMES``): the events written under ``out_dir``."""
    from tidemark.engine.pipeline import compile_sql

    if name not in NAMES:
        raise ValueError(f"no Nexmark workload {name!r}; expected one of {', '.join(NAMES)}")
    query = name.removeprefix(PREFIX)
    sql = harness.query_sql(query)
    pipeline = compile_sql(sql)
    n_events = max(MIN_EVENTS, round(EVENTS_PER_SCALE * scale))
    rows: dict[str, list[dict]] = {t: [] for t in (*harness.SIDE_TABLES, *generator.TABLES)}
    for t, side in harness.SIDE_TABLES.items():
        rows[t] = side()
    for e in generator.generate(seed, n_events):
        rows[e.table].append(e.row)
    # every declared table gets a file (Flink's DDL names them all); the used ones are input
    files = {t: out_dir / f"{t}.json" for t in rows}
    for t, path in files.items():
        _write(path, rows[t])
    used = {t: files[t] for t in rows if t in pipeline.sources}
    sink = pipeline.sink
    return NexmarkWorkload(
        name=name, tables=used, formats={t: pipeline.sources[t].format for t in used},
        input_rows=sum(len(rows[t]) for t in used), sink=sink.name, sink_columns=list(sink.column_names),
        sink_pk=list(sink.primary_key), expected=None, strategy=None,
        tidemark_variants={"default": spark_host.bounded(sql, pipeline)}, flink_variants={"default": {}}, select="", specs={},
        params={"query": query, "events": n_events}, query_sql=sql, declared=files,
        # one partition per topic, as the Spark test has it: the order of the events is part of
        # the result (ties of a rank, the watermark), and Flink reads each file in order
        source_partitions=1,
    )
