"""Running one Nexmark query on both systems: Flink 2.3 (the oracle) and Tidemark's replay host.

Both get the same generated events (``generator.py``) cut into the same micro-batches. Flink
runs through ``tests/conformance/flink_oracle.py`` (one subprocess, one JVM, for all the
cases asked for at once); its reports are cached on disk by (query text, seed, events,
batches), so a rerun with unchanged queries and data starts no JVM at all. Tidemark runs
in-process: ``compile_sql`` (what ``tidemark explain`` plans) and ``ReplayHost`` (what
``tidemark replay`` runs), one ``run_batch`` per micro-batch.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
QUERIES = HERE / "queries"
#: the source tables every query reads from, declared once (``tidemark ... --init sources.sql``)
SOURCES = QUERIES / "sources.sql"
CACHE = HERE / ".flink-cache"
ORACLE = REPO / "tests" / "conformance" / "flink_oracle.py"
FLINK_PYTHON = Path(os.environ.get("TIDEMARK_FLINK_PYTHON", REPO / ".venv-flink" / "bin" / "python"))
sys.path.insert(0, str(HERE))
import generator  # noqa: E402  (sibling module, not a package)

#: the 24 queries of nexmark-flink/src/main/resources/queries
QUERY_NAMES = [f"q{n}" for n in range(24)]
#: q13's side table (a compacted topic) is fed in before the first event
SIDE_TABLES = {"side_input": generator.side_input}
#: a lookup join's ``FOR SYSTEM_TIME AS OF <attribute>``: over a side table loaded before the
#: first event and never changed, a lookup join is the regular join, which Flink runs on the
#: oracle's sources (they are not lookup sources)
#: ``make conformance`` runs on more events and batches than ``make test``
FULL = os.environ.get("TIDEMARK_CONFORMANCE", "").lower() == "full"
_LOOKUP = re.compile(r"\s+FOR\s+SYSTEM_TIME\s+AS\s+OF\s+[\w.`]+", re.I)


@dataclass(frozen=True)
class Data:
    """Which generated events a comparison runs on."""

    seed: int
    n_events: int
    n_batches: int
    jitter_ms: int = 0

    def batches(self) -> list[list[generator.Event]]:
        events = generator.generate(self.seed, self.n_events, jitter_ms=self.jitter_ms)
        return generator.split_batches(events, self.n_batches)


def data(full: bool) -> Data:
    """The events every comparison runs on: the fast slice of ``make test``, or ``make
    conformance``'s (``full``). Event time out of order by up to 1.5 s, never late (the
    watermark delay is 4 s)."""
    if full:
        return Data(seed=42, n_events=20_000, n_batches=10, jitter_ms=1500)
    return Data(seed=42, n_events=3_000, n_batches=3, jitter_ms=1500)


def query_sql(name: str) -> str:
    """The query as one script, its sources first: what ``--init sources.sql`` compiles."""
    return "\n".join(p.read_text(encoding="utf-8") for p in (SOURCES, QUERIES / f"{name}.sql"))


def today_dialect(sql: str) -> str:
    """The query in the dialect Tidemark's planner reads: backtick identifiers written plain
    and the ``WATERMARK`` clause dropped. Neither construct is planned, so this is the form in
    which the queries that need nothing else can run and be compared with Flink."""
    without_watermark = re.sub(r",\s*WATERMARK FOR [^\n]*", "", sql)
    return without_watermark.replace("`", "")


def oracle_sql(sql: str) -> str:
    """The query as Flink runs it: a lookup join's ``FOR SYSTEM_TIME AS OF`` dropped (see
    ``_LOOKUP``)."""
    return _LOOKUP.sub("", sql)


def _source_tables(sql: str) -> list[str]:
    names = re.findall(r"CREATE TABLE\s+(\w+)", sql, re.I)
    return [n for n in names if n in generator.TABLES or n in SIDE_TABLES]


def oracle_case(case_id: str, sql: str, data: Data) -> dict:
    """The oracle's job spec for ``sql`` on ``data``: every event keeps its generation position
    as ``seq``, so Flink sees the three topics interleaved as they were generated."""
    tables = _source_tables(sql)
    inputs: dict[str, list[list[dict]]] = {t: [] for t in tables}
    seq = 0
    for b, batch in enumerate(data.batches()):
        for t in tables:
            inputs[t].append([])
        if b == 0:
            for t in tables:
                if t in SIDE_TABLES:
                    for row in SIDE_TABLES[t]():
                        inputs[t][0].append({"kind": "+I", "row": row, "seq": seq})
                        seq += 1
        for e in batch:
            if e.table in inputs:
                inputs[e.table][b].append({"kind": "+I", "row": e.row, "seq": seq})
            seq += 1
    return {"id": case_id, "sql": oracle_sql(sql), "inputs": inputs}


def _cache_path(case: dict) -> Path:
    digest = hashlib.sha256(json.dumps([case["sql"], case["inputs"]], sort_keys=True).encode())
    return CACHE / f"{case['id']}-{digest.hexdigest()[:20]}.json"


def flink_results(cases: list[dict], slots: int = 2, timeout_s: float = 300) -> dict[str, dict]:
    """Flink's report per case id: from the cache, the rest from one oracle subprocess."""
    out: dict[str, dict] = {}
    missing = []
    for case in cases:
        path = _cache_path(case)
        if path.exists():
            out[case["id"]] = json.loads(path.read_text(encoding="utf-8"))
        else:
            missing.append(case)
    if not missing:
        return out
    if not FLINK_PYTHON.exists():
        raise RuntimeError(f"Flink 2.3 is the Nexmark oracle but its python is missing ({FLINK_PYTHON}); "
                           "run `make install-flink` or set TIDEMARK_FLINK_PYTHON")
    spec = {"cases": missing, "slots": slots, "case_timeout_s": timeout_s}
    # q14's UDF module (nexmark_udfs) is imported by Flink's Python workers from this folder
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([str(FLINK_PYTHON), str(ORACLE)], input=json.dumps(spec),
                          capture_output=True, text=True, timeout=3600, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"flink_oracle.py exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    report = json.loads(proc.stdout)
    if report["flink_version"] != "2.3.0":
        raise RuntimeError(f"the oracle must be Flink 2.3.0, got {report['flink_version']}")
    CACHE.mkdir(exist_ok=True)
    for case, res in zip(missing, report["results"]):
        _cache_path(case).write_text(json.dumps(res), encoding="utf-8")
        out[case["id"]] = res
    return out


def canon(rows: list) -> list[list]:
    """Rows as sorted JSON lists, so Tidemark's and Flink's values compare equal: decimals as
    their plain text, timestamps as ``yyyy-MM-dd HH:mm:ss.SSS`` (both are TIMESTAMP(3) here)."""
    out = []
    for row in rows:
        values = json.loads(json.dumps(list(row), default=str))
        out.append([_canon_value(v) for v in values])
    return sorted(out, key=lambda r: json.dumps(r, sort_keys=True))


_TS = re.compile(r"^(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})(?:\.(\d+))?$")


def _canon_value(v):
    if isinstance(v, str) and (m := _TS.match(v)):
        return f"{m.group(1)} {m.group(2)}.{(m.group(3) or '').ljust(3, '0')[:3]}"
    return v


def run_tidemark(sql: str, data: Data) -> list[list[list]]:
    """The sink table after every batch (a multiset when the sink has no primary key)."""
    from tidemark.engine.changelog import Change
    from tidemark.engine.pipeline import compile_sql
    from tidemark.engine.records import parse_row
    from tidemark.engine.replay import ReplayHost

    pipeline = compile_sql(sql)
    host = ReplayHost(pipeline)
    keyed = bool(pipeline.sink.pk_indexes)
    multiset: Counter = Counter()
    steps = []
    seq = 0
    side: dict[str, list] = {}
    for t in pipeline.sources:
        if t in SIDE_TABLES:
            side[t] = []
            for row in SIDE_TABLES[t]():
                side[t].append(Change("+I", parse_row(pipeline.sources[t], "+I", row), (seq,)))
                seq += 1
    if side:  # a batch of its own: loaded before the first event is processed
        for c in host.run_batch(side, now_ms=-1):
            multiset[c.row] += c.weight
    for b, batch in enumerate(data.batches()):
        inputs: dict[str, list] = {t: [] for t in pipeline.sources}
        for e in batch:
            if e.table in inputs:
                inputs[e.table].append(Change("+I", parse_row(pipeline.sources[e.table], "+I", e.row), (seq,)))
            seq += 1
        changes = host.run_batch(inputs, now_ms=b)
        if b == data.n_batches - 1:  # end of input: the windows still open fire, as in Flink
            changes += host.finish(now_ms=b)
        for c in changes:
            multiset[c.row] += c.weight
        if keyed:
            steps.append(canon(host.table().values()))
        else:
            steps.append(canon([r for r, n in multiset.items() for _ in range(n)]))
    return steps
