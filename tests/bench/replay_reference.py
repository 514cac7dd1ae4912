"""A workload's final sink table as Tidemark's reference host computes it (``ReplayHost``,
no Spark, no Kafka): the in-process answer the Flink runner's table is checked against in
tests, and a cheap cross-check of ``Workload.expected``.

Records are decoded with Tidemark's own Kafka decoders (the same code ``tidemark run`` uses),
tables in production order, one source position per record, ``batch_size`` records per
micro-batch (a batch never splits a Debezium update: its -U/+U come from one record).
"""

from __future__ import annotations

from tidemark.engine.changelog import Change
from tidemark.engine.pipeline import compile_sql
from tidemark.engine.replay import ReplayHost
from tidemark.formats.codecs import decoder_for

try:  # imported as tests.bench.replay_reference or from tests/bench on sys.path
    from tests.bench.workloads import Workload
except ImportError:  # pragma: no cover
    from workloads import Workload  # type: ignore[no-redef]


def replay_table(workload: Workload, variant: str | None = None, batch_size: int = 5_000) -> dict[tuple, tuple]:
    """Run ``workload`` (Tidemark variant ``variant``, default the first) through the replay
    host and return its sink table (sink PK tuple -> row tuple)."""
    sql = workload.tidemark_variants[variant] if variant else workload.tidemark_sql
    host = ReplayHost(compile_sql(sql))
    for batch in decoded_batches(workload, batch_size, sql):
        host.run_batch(batch, now_ms=0)
    return host.table()


def decoded_batches(workload: Workload, batch_size: int = 5_000, sql: str | None = None) -> list[dict[str, list[Change]]]:
    """The workload's records decoded (for pipeline ``sql``, default the first variant's),
    ``batch_size`` records per batch: table name -> changes."""
    pipeline = compile_sql(sql or workload.tidemark_sql)
    batches: list[dict[str, list[Change]]] = []
    batch: dict[str, list[Change]] = {}
    n = 0
    pos = 0
    for table, path in workload.tables.items():
        decoder = decoder_for(pipeline.sources[table])
        with open(path, "rb") as f:
            for line in f:
                pos += 1
                batch.setdefault(table, []).extend(decoder.decode(None, line.rstrip(b"\n"), (pos,)))
                n += 1
                if n >= batch_size:
                    batches.append(batch)
                    batch, n = {}, 0
    if batch:
        batches.append(batch)
    return batches
