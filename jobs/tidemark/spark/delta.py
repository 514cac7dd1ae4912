"""Host a ``DeltaJoin`` in the Spark job with no join state: no state store operator at all.

Shape: both join inputs arrive split by the join key's bucket (``BLOB_SCHEMA``, as for any
keyed stage), are unioned and repartitioned by bucket, and ONE ``mapInArrow`` per partition runs the
stage bound to the index service (``HttpLookup``): ``begin_batch(batch_id, fences)`` then
``process_batch(inputs, ctx)``, which asks the index once per side for every key the
partition's caches miss. What it emits has the shape ``tidemark.spark.keyed`` emits
(``BLOB_SCHEMA`` rows, split by the next keyed stage's buckets), and its counters go to
the same ``StageMetrics`` accumulator, so the rest of the query cannot tell the difference.

Why one bound stage per (query build, shuffle partition) per Python worker: the LRU caches
are only valid while one instance sees every batch of its keys. Hash partitioning by
bucket keeps a key in the same shuffle partition from batch to batch; the partition may run on another
worker next time, and then the instance that ran it before sees a gap in batch ids and
``begin_batch`` clears its caches. One instance per worker (not per partition) would miss
that gap when a partition left and came back between consecutive batches of that worker.

Offset fences: the driver reads the batch's offsets from Spark's own write-ahead offset log
(``<checkpoint>/offsets/<batch>`` and ``<batch - 1>``), which Spark writes before any task
of the batch runs and which holds the source's ``{topic: {partition: next offset}}`` JSON,
and hands them to the tasks as a Spark *local property* set in ``foreachBatch`` just before
the batch runs (local properties travel with every task, on ``local[*]`` and on a
cluster). Batch 0 starts from nothing (``startingOffsets = earliest``: the index has no
record below a topic's first offset either).
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter, OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tidemark.engine.catalog import TableDef
from tidemark.engine.checkpoint_path import local_dir
from tidemark.engine.changelog import Change
from tidemark.engine.errors import TidemarkError
from tidemark.engine.stage import BatchContext, KeyedStage, StatelessStage
from tidemark.spark.keyed import (
    BATCH_ID_PROPERTY,
    BLOB_COLUMNS,
    BLOB_SCHEMA,
    DEFAULT_STATE_BUCKETS,
    StageCrash,
    StageFailure,
    StageMetrics,
    arrow_pairs,
    blob_batch,
    blob_rows,
    blobs_by_input,
    changes_of_blobs,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: the local property carrying the batch's fences: JSON ``{table: [start, end]}``
FENCES_PROPERTY = "tidemark.delta.fences"

Offsets = dict[int, int]
Fences = dict[str, tuple[Offsets, Offsets]]


@dataclass(frozen=True)
class IndexTarget:
    """Where the executors look rows up: the index service and the tables it serves."""

    url: str
    tables: Mapping[str, TableDef]
    token: str | None = None
    #: table -> topic, for reading fences from the offset log
    topics: Mapping[str, str] = field(default_factory=dict)


def is_delta_join(stage: Any) -> bool:
    """A stage this module hosts: a delta join, or a lookup join whose dimension has an
    index (both ``bind``, ``begin_batch`` and ``process_batch``; no state)."""
    from tidemark.engine.stages.delta_join import DeltaJoin
    from tidemark.engine.stages.lookup_join import LookupJoin

    return isinstance(stage, DeltaJoin) or (isinstance(stage, LookupJoin) and stage.index is not None)


def delta_joins(pipeline: Any) -> list[Any]:
    return [n.stage for n in pipeline.nodes if is_delta_join(n.stage)]


# ---------------------------------------------------------------------------- fences


def read_offset_log(checkpoint: str, batch_id: int, spark: SparkSession | None = None) -> dict[str, dict[int, int]] | None:
    """The end offsets Spark logged for ``batch_id`` as ``{topic: {partition: offset}}``
    (every source of the query merged), or None when there is no such entry. Local
    checkpoints are read directly; others through the JVM's Hadoop file system."""
    if batch_id < 0:
        return None
    text = _read_checkpoint_file(checkpoint, f"offsets/{batch_id}", spark)
    if text is None:
        return None
    out: dict[str, dict[int, int]] = {}
    for line in text.splitlines()[2:]:  # "v1", the batch metadata, then one line per source
        line = line.strip()
        if not line.startswith("{"):
            continue  # "-": a source with no offset yet
        try:
            value = json.loads(line)
        except ValueError:
            continue
        for topic, parts in value.items():
            if isinstance(parts, dict) and all(isinstance(o, int) for o in parts.values()):
                out[topic] = {int(p): int(o) for p, o in parts.items()}
    return out


def _read_checkpoint_file(checkpoint: str, rel: str, spark: SparkSession | None) -> str | None:
    directory = local_dir(checkpoint)
    if directory is not None:
        path = directory / rel
        try:
            return path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
    if spark is None:
        raise ValueError(f"reading {checkpoint}/{rel} needs the SparkSession (not a local path)")
    jvm = spark.sparkContext._jvm
    hpath = jvm.org.apache.hadoop.fs.Path(f"{checkpoint.rstrip('/')}/{rel}")
    fs = hpath.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    if not fs.exists(hpath):
        return None
    stream = fs.open(hpath)
    try:
        return jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8")
    finally:
        stream.close()


def batch_fences(
    checkpoint: str, batch_id: int, topics: Mapping[str, str], spark: SparkSession | None = None
) -> Fences:
    """``{table: (start offsets, end offsets)}`` of ``batch_id`` for the tables in
    ``topics`` (table -> topic). Start is the previous batch's end (nothing for batch 0)."""
    end = read_offset_log(checkpoint, batch_id, spark)
    if end is None:
        raise RuntimeError(f"no offset log entry for batch {batch_id} in {checkpoint}")
    start = read_offset_log(checkpoint, batch_id - 1, spark) or {}
    return {table: (dict(start.get(topic, {})), dict(end.get(topic, {}))) for table, topic in topics.items()}


def encode_fences(fences: Fences) -> str:
    return json.dumps({t: [{str(p): o for p, o in s.items()}, {str(p): o for p, o in e.items()}] for t, (s, e) in fences.items()})


def decode_fences(text: str | None) -> Fences | None:
    if not text:
        return None
    raw = json.loads(text)
    return {t: ({int(p): o for p, o in s.items()}, {int(p): o for p, o in e.items()}) for t, (s, e) in raw.items()}


def set_batch_fences(spark: SparkSession, fences: Fences) -> None:
    """Call in ``foreachBatch`` before running the batch: its tasks will see ``fences``."""
    spark.sparkContext.setLocalProperty(FENCES_PROPERTY, encode_fences(fences))


# ---------------------------------------------------------------------------- executor side

#: per Python worker: (query build token, shuffle partition) -> the bound stage, least
#: recently used first. Bounded: instances of stopped queries would otherwise stay forever;
#: an evicted instance of a live query is rebuilt with empty caches (still right).
_BOUND: OrderedDict[tuple[str, int], Any] = OrderedDict()
MAX_BOUND = 64


def _bound_stage(token: str, partition: int, stage: Any, target: IndexTarget) -> Any:
    key = (token, partition)
    bound = _BOUND.get(key)
    if bound is None:
        from tidemark.index_client.http import HttpLookup

        bound = _BOUND[key] = stage.bind(HttpLookup(target.url, target.tables, target.token))
        while len(_BOUND) > MAX_BOUND:
            _BOUND.popitem(last=False)
    _BOUND.move_to_end(key)
    return bound


def process_partition(
    stage: Any,
    inputs: Sequence[Sequence[Change]],
    batch_id: int,
    fences: Fences | None,
    metrics: Counter,
    after: Sequence[StatelessStage] = (),
) -> list[Change]:
    """One partition of one batch through a bound delta join (Spark-free, so testable
    without a session): ``inputs`` are the changes of each join side."""
    inputs = [list(cs) for cs in inputs]
    ctx = BatchContext(batch_id=batch_id, now_ms=int(time.time() * 1000))
    try:
        stage.begin_batch(batch_id, fences)
        out = stage.process_batch(inputs, ctx) if inputs[0] or inputs[1] else []
        for st in after:
            out = st.process(out)
    except TidemarkError as err:
        raise StageFailure(err) from None
    except Exception as err:
        raise StageFailure(StageCrash(f"stage '{stage.name}' failed: {type(err).__name__}: {err}")) from err
    metrics.update({f"{stage.name}.{k}": v for k, v in ctx.metrics.items() if v})
    return out


def run_delta_join(
    inputs: Sequence[DataFrame],
    stage: Any,
    target: IndexTarget,
    metrics: StageMetrics | None = None,
    downstream: tuple[KeyedStage, int] | None = None,
    after: Sequence[StatelessStage] = (),
    schema: Any = None,
    buckets: int = DEFAULT_STATE_BUCKETS,
) -> DataFrame:
    """The delta join over its two inputs (``BLOB_SCHEMA`` rows split by its buckets),
    stateless: the changes it emits per batch, after the stateless stages ``after`` (calc
    between the join and what follows), as ``BLOB_SCHEMA`` rows split by ``downstream``'s
    ``buckets`` (``schema``: the Arrow schema of what ``after`` emits)."""
    if len(inputs) != 2:
        raise ValueError(f"delta join '{stage.name}' takes 2 inputs, got {len(inputs)}")
    df = inputs[0].select(*BLOB_COLUMNS).unionByName(inputs[1].select(*BLOB_COLUMNS)).repartition("bucket")
    token = uuid.uuid4().hex
    acc = metrics.accumulator if metrics is not None else None
    post = list(after)

    def fn(batches: Iterator[Any]) -> Iterator[Any]:
        from pyspark import TaskContext

        tc = TaskContext.get()
        batch_id = int(tc.getLocalProperty(BATCH_ID_PROPERTY) or -1)
        fences = decode_fences(tc.getLocalProperty(FENCES_PROPERTY))
        sides = [changes_of_blobs(blobs) for blobs in blobs_by_input(arrow_pairs(batches), 2)]
        bound = _bound_stage(token, tc.partitionId(), stage, target)
        counts: Counter = Counter()
        out = process_partition(bound, sides, batch_id, fences, counts, post)
        if counts and acc is not None:
            acc.add(counts)
        rows = blob_rows(out, schema, downstream, buckets)
        if rows:
            yield blob_batch(rows)

    return df.mapInArrow(fn, BLOB_SCHEMA)
