"""Flink 2.3 as a conformance oracle: run Tidemark pipeline SQL on a changelog, report the sink.

Run with the Flink venv's python (``$TIDEMARK_FLINK_PYTHON``, default
``/work/main/.venv-flink/bin/python``) as a subprocess. It reads a JSON job spec on stdin::

    {"cases": [{"id": "c1",
                "sql": "CREATE TABLE s1 (...) WITH (...); ...; INSERT INTO t ... ON CONFLICT DO ...;",
                "inputs": {"s1": [[{"kind": "+I", "row": {...} | [...], "seq": 3}, ...], ...], ...},
                "options": {"table.exec.sink.upsert-materialize-strategy.type": "LEGACY"}}],
     "slots": 6, "case_timeout_s": 120}

``inputs`` maps each source table to its batches (all tables have the same number of batches;
a shorter list is padded with empty batches). Inside a batch, records of all tables are fed to
Flink in ``seq`` order (then table by table, as listed), which is the source-position order
Tidemark uses for "latest". It writes on stdout::

    {"flink_version": "2.3.0", "results": [{"id": "c1", "ok": true, "error": null,
      "steps": [[row, ...] after batch 1, ...], "final": [row, ...], "changelog": [...]}]}

where a row is a JSON list in the sink's column order and ``steps[i]`` is the sink table after
batch ``i+1`` (rows sorted), and ``final`` the table at the end of input. A case whose SQL is a
statement set (``EXECUTE STATEMENT SET BEGIN INSERT ...; INSERT ...; END;``) runs as one Flink
job through the ``StatementSet`` API, and its result adds ``"sinks": {table: {"steps", "final"}}``
(the top-level ``steps``/``final`` are the first sink's); the lockstep waits for every sink. ``ok`` is false when Flink rejected the SQL or the job failed (e.g.
``ON CONFLICT DO ERROR``); ``steps`` then holds the batches completed before the failure.

How it stays deterministic (see ``docs/conformance.md``): every table of the SQL is re-pointed
at the ``tidemark-oracle`` connector (Java, in ``oracle_java/``, compiled here with javac on
first use). Its sources release one global record sequence in lockstep, proven drained by
aligned checkpoints whenever the next record belongs to another table, and end each batch with
watermark ``i`` on every source (a table's own ``WATERMARK FOR ... AS ...`` is taken over by
the source too, so no event is ever late and event-time windows fire at the end of input); its
sink materializes the upsert stream Flink writes (a multiset when the sink has no primary key)
and snapshots the table on every watermark. All cases run on one session mini-cluster started in the
gateway JVM, each as its own job (in its own database), ``slots`` at a time: the ~10 s JVM and
cluster start-up is paid once per subprocess, and a job that fails (``DO ERROR``) fails alone.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
JAVA_SRC = HERE / "oracle_java" / "src"
KINDS = ("+I", "-U", "+U", "-D")
ROWTIME = "__tidemark_rowtime"
DEFAULT_SLOTS = 6
DEFAULT_CASE_TIMEOUT_S = 120

BASE_CONFIG = {
    "parallelism.default": "1",
    # checkpoints are the oracle's "record processed everywhere" signal (aligned, exactly-once
    # mode); the connector triggers them on demand, the periodic interval only switches them on
    "execution.checkpointing.interval": "1 h",
    "execution.checkpointing.min-pause": "0 ms",
    # otherwise a finished task waits for one more checkpoint, which nobody triggers
    "execution.checkpointing.checkpoints-after-tasks-finish": "false",
    "restart-strategy.type": "none",
    # flush every record at once: the lockstep waits on each step, buffering only adds latency
    "execution.buffer-timeout.interval": "0 ms",
    # Python UDFs (CREATE FUNCTION ... LANGUAGE PYTHON) run in this interpreter, which has PyFlink
    "python.executable": sys.executable,
    "python.client.executable": sys.executable,
}


class SpecError(ValueError):
    """The job spec is malformed; the message names the case and what is wrong."""


# --------------------------------------------------------------------------------------------
# SQL handling: statements, table names, WITH-clause rewrite
# --------------------------------------------------------------------------------------------

def split_statements(sql: str) -> list[str]:
    """Split on ``;`` outside quotes and comments; drop empty statements and ``--`` comments."""
    out, buf, i, quote = [], [], 0, None
    while i < len(sql):
        ch = sql[i]
        if quote:
            buf.append(ch)
            if ch == quote:
                if i + 1 < len(sql) and sql[i + 1] == quote:
                    buf.append(sql[i + 1])
                    i += 1
                else:
                    quote = None
        elif ch in ("'", '"', "`"):
            quote = ch
            buf.append(ch)
        elif sql.startswith("--", i):
            while i < len(sql) and sql[i] != "\n":
                i += 1
            continue
        elif ch == ";":
            out.append("".join(buf).strip())
            buf = []
        else:
            buf.append(ch)
        i += 1
    out.append("".join(buf).strip())
    return [s for s in out if s]


_IDENT = r"(`[^`]+`|[A-Za-z_][A-Za-z0-9_]*)"
_CREATE_RE = re.compile(r"^\s*CREATE\s+(?:TEMPORARY\s+)?TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?" + _IDENT, re.I)
_INSERT_RE = re.compile(r"^\s*INSERT\s+INTO\s+" + _IDENT, re.I)
_SET_RE = re.compile(r"^\s*SET\s+'([^']+)'\s*=\s*'([^']*)'\s*$", re.I | re.S)
#: statements run as written after the tables are created (Nexmark's q12 and q14 use them)
_PASSTHROUGH_RE = re.compile(r"^\s*CREATE\s+(?:TEMPORARY\s+)?(?:VIEW|FUNCTION)\b", re.I)
_PYTHON_FUNCTION_RE = re.compile(r"\bLANGUAGE\s+PYTHON\b", re.I)
#: a computed column (``name AS expr``) in a column list: Flink computes it, the input has none
_COMPUTED_RE = re.compile(r"[(,]\s*" + _IDENT + r"\s+AS\s", re.I)
_CONFLICT_RE = re.compile(r"\bON\s+CONFLICT\s+DO\s+(NOTHING|ERROR|DEDUPLICATE)\b", re.I)
#: the head of a statement set, in front of its first INSERT (or alone: Flink's client form)
_SET_BEGIN_RE = re.compile(r"^\s*(?:EXECUTE\s+STATEMENT\s+SET\s+BEGIN|BEGIN\s+STATEMENT\s+SET)\b", re.I)
_END_RE = re.compile(r"^\s*END\s*$", re.I)


def _unquote(name: str) -> str:
    return name[1:-1] if name.startswith("`") else name


def _depth0_positions(stmt: str) -> list[tuple[int, str, int]]:
    """(index, char, depth-before-char) for every char outside quotes."""
    out, depth, quote = [], 0, None
    for i, ch in enumerate(stmt):
        if quote:
            if ch == quote:
                quote = None
            continue
        if ch in ("'", '"', "`"):
            quote = ch
            continue
        out.append((i, ch, depth))
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
    return out


def rewrite_create_table(stmt: str, options: dict[str, str], add_watermark: bool) -> str:
    """Replace the table's ``WITH (...)`` options by ``options``; optionally add a rowtime column
    with ``WATERMARK ... AS SOURCE_WATERMARK()`` (Flink's ON CONFLICT DO NOTHING/ERROR insist on
    watermarks on every source; the oracle's sources emit one per batch themselves)."""
    chars = _depth0_positions(stmt)
    opens = [i for i, ch, d in chars if ch == "(" and d == 0]
    closes = [i for i, ch, d in chars if ch == ")" and d == 1]
    if not opens or not closes:
        raise SpecError(f"cannot find the column list of: {stmt[:80]}")
    col_end = closes[0]
    head, tail = stmt[:col_end], stmt[col_end:]
    if add_watermark:
        head += (f", {ROWTIME} AS CAST(TO_TIMESTAMP_LTZ(0, 3) AS TIMESTAMP_LTZ(3)), "
                 f"WATERMARK FOR {ROWTIME} AS SOURCE_WATERMARK()")
    m = re.search(r"\)\s*WITH\s*\(", tail, re.I)
    base = tail[: m.start() + 1] if m else tail
    opts = ", ".join(f"'{k}' = '{v}'" for k, v in options.items())
    return f"{head}{base} WITH ({opts})"


def parse_case_sql(sql: str) -> dict[str, Any]:
    """Statements of one case: SET options, CREATE TABLEs (name -> statement), CREATE VIEW
    and CREATE FUNCTION statements (in order), the INSERT."""
    sets: dict[str, str] = {}
    creates: dict[str, str] = {}
    passthrough: list[str] = []
    inserts: list[tuple[str, str]] = []
    statement_set = False
    for stmt in split_statements(sql):
        if m := _SET_BEGIN_RE.match(stmt):
            statement_set = True
            stmt = stmt[m.end():]
            if not stmt.strip():
                continue
        if _END_RE.match(stmt):
            continue
        if m := _SET_RE.match(stmt):
            sets[m.group(1)] = m.group(2)
        elif m := _CREATE_RE.match(stmt):
            creates[_unquote(m.group(1))] = stmt
        elif _PASSTHROUGH_RE.match(stmt):
            passthrough.append(stmt)
        elif m := _INSERT_RE.match(stmt):
            if inserts and not statement_set:
                raise SpecError("more than one INSERT statement outside a statement set")
            inserts.append((_unquote(m.group(1)), stmt))
        else:
            raise SpecError(f"unsupported statement: {stmt[:80]}")
    if not inserts:
        raise SpecError("no INSERT INTO statement")
    for sink, _ in inserts:
        if sink not in creates:
            raise SpecError(f"INSERT INTO {sink}: table not created")
    strategies = {c.group(1).upper() for _, stmt in inserts if (c := _CONFLICT_RE.search(stmt))}
    return {
        "sets": sets,
        "creates": creates,
        "passthrough": passthrough,
        "sink": inserts[0][0],
        "insert": inserts[0][1],
        "sinks": [name for name, _ in inserts],
        "inserts": [stmt for _, stmt in inserts],
        "statement_set": statement_set,
        "python_functions": any(_PYTHON_FUNCTION_RE.search(stmt) for stmt in passthrough),
        # sources need watermarks when any INSERT's strategy does
        "strategy": next((s for s in ("NOTHING", "ERROR", "DEDUPLICATE") if s in strategies), None),
    }


def changelog_mode(create_stmt: str) -> str:
    """Flink changelog mode of a Tidemark source from its ``format`` option."""
    m = re.search(r"'format'\s*=\s*'([^']*)'", create_stmt, re.I)
    fmt = (m.group(1) if m else "debezium-json").lower()
    if fmt.startswith("upsert-"):
        return "upsert"
    if fmt in ("json", "avro", "csv", "raw"):
        return "insert-only"
    return "all"


# --------------------------------------------------------------------------------------------
# Input script: per-table batches -> one ordered event list per batch
# --------------------------------------------------------------------------------------------

def build_script(case_id: str, inputs: dict[str, list], columns: dict[str, list[str]],
                 modes: dict[str, str]) -> dict[str, Any]:
    """Merge the tables' batches into the global order the oracle feeds Flink."""
    n_batches = max((len(b) for b in inputs.values()), default=0)
    batches = []
    for bi in range(n_batches):
        recs = []
        for ti, (table, tbatches) in enumerate(inputs.items()):
            if table not in columns:
                raise SpecError(f"case {case_id}: input for unknown table {table!r}")
            batch = tbatches[bi] if bi < len(tbatches) else []
            for ri, rec in enumerate(batch):
                where = f"case {case_id}: {table} batch {bi + 1} record {ri + 1}"
                kind = rec.get("kind")
                if kind not in KINDS:
                    raise SpecError(f"{where}: unknown kind {kind!r}")
                if modes[table] == "upsert" and kind == "-U":
                    raise SpecError(f"{where}: -U in an upsert source (upsert streams carry no before-images)")
                if modes[table] == "insert-only" and kind != "+I":
                    raise SpecError(f"{where}: {kind} in an append-only source")
                row = rec.get("row")
                cols = columns[table]
                if isinstance(row, dict):
                    unknown = set(row) - set(cols)
                    if unknown:
                        raise SpecError(f"{where}: unknown columns {sorted(unknown)}")
                    row = [row.get(c) for c in cols]
                if not isinstance(row, list) or len(row) != len(cols):
                    raise SpecError(f"{where}: row must be a dict or a list of {len(cols)} values")
                seq = rec.get("seq")
                key = (0 if seq is not None else 1, seq if seq is not None else 0, ti, ri)
                recs.append((key, {"table": table, "kind": kind, "row": row}))
        recs.sort(key=lambda x: x[0])
        batches.append([r for _, r in recs])
    return {"tables": list(columns), "batches": batches}


# --------------------------------------------------------------------------------------------
# The Java side
# --------------------------------------------------------------------------------------------

def flink_lib_dir() -> Path:
    import pyflink

    return Path(pyflink.__file__).resolve().parent / "lib"


def build_oracle_jar() -> Path:
    """Compile ``oracle_java`` against this pyflink's jars (cached by source hash)."""
    return build_connector_jar(JAVA_SRC, "tidemark-oracle")


def build_connector_jar(src: Path, name: str) -> Path:
    """Compile the Java connector under ``src`` (sources and ``META-INF/services``) against
    this pyflink's jars, cached per machine (``tidemark.java_build``: a changed connector or
    Flink is rebuilt, an unchanged one costs nothing; shared by the oracle and the benchmark
    sink)."""
    java_build = _java_build()
    return java_build.compiled_jar(src, sorted(flink_lib_dir().glob("*.jar")), name, java_build.cache_dir())


def _java_build() -> Any:
    """``tidemark.java_build`` (standard library only), loaded from its file: the Flink venv has
    nothing of Tidemark installed, and Tidemark's packages on its path would change what the
    UDF modules this interpreter runs import (``tests/nexmark/nexmark_udfs.py`` picks its
    PyFlink form when ``tidemark`` cannot be imported)."""
    import importlib.util

    path = HERE.parent.parent / "jobs" / "tidemark" / "java_build.py"
    spec = importlib.util.spec_from_file_location("tidemark_java_build", path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _java_error(exc: BaseException) -> str:
    """The innermost meaningful message of a py4j/Flink exception, without stack frames."""
    text = str(exc)
    causes = re.findall(r"(?:Caused by: |^: |\n: )([\w.$]+(?:Exception|Error)[^\n]*)", text)
    msg = causes[-1] if causes else text.strip().splitlines()[0]
    return msg.strip()


# --------------------------------------------------------------------------------------------
# Running cases
# --------------------------------------------------------------------------------------------

PLANNER_THREAD_ERROR = "NullPointerException: metadataHandlerProvider"
PLANNER_THREAD_RETRIES = 5


class Oracle:
    """Runs cases as jobs on one session mini-cluster, ``slots`` of them at a time."""

    def __init__(self, slots: int) -> None:
        from pyflink.java_gateway import get_gateway
        from pyflink.table import EnvironmentSettings, TableEnvironment

        jvm = get_gateway().jvm
        self._settings = EnvironmentSettings.in_streaming_mode()
        self._table_env_cls = TableEnvironment
        self._coord = jvm.tidemark.flinkoracle.Coordinator
        port = jvm.tidemark.flinkoracle.SessionCluster.start(slots, 64 * slots)
        self._remote = {"execution.target": "remote", "rest.address": "127.0.0.1",
                        "rest.port": str(port)}
        self._envs: dict[tuple, Any] = {}
        self._db_counter = 0
        self.slots = slots

    def _env(self, options: dict[str, str], python_functions: bool):
        """A table environment per set of options. A case that declares a Python function gets
        environments of its own: once a Python function is registered, Flink's table
        ``ResourceManager`` ships the flink-python jar with every later job of that
        environment, through the cluster's REST upload and blob store."""
        key = (python_functions, *sorted(options.items()))
        if key not in self._envs:
            t = self._table_env_cls.create(self._settings)
            conf = t.get_config()
            for k, v in {**BASE_CONFIG, **self._remote, **options}.items():
                conf.set(k, v)
            self._envs[key] = t
        return self._envs[key]

    def submit(self, case: dict) -> dict:
        """Plan ``case`` and submit its job, again when planning failed on Calcite's metadata
        provider missing from the JVM thread py4j ran the call on (a query calling a Python
        UDF can land on a thread the planner never set up: ``PLANNER_THREAD_ERROR``)."""
        for _ in range(PLANNER_THREAD_RETRIES):
            job = self._submit_once(case)
            if PLANNER_THREAD_ERROR not in (job["result"]["error"] or ""):
                return job
            self._envs.clear()  # plan the next try in a table environment of its own
        return job

    def _submit_once(self, case: dict) -> dict:
        """Plan ``case`` and submit its job. Returns the running job's handle, or the case's
        result when Flink rejected it at planning."""
        res = {"id": case["id"], "ok": False, "error": None, "phase": "plan", "steps": [],
               "final": None, "changelog": []}
        try:
            parsed = parse_case_sql(case["sql"])
            t = self._env({**parsed["sets"], **case.get("options", {})}, parsed["python_functions"])
            oracle_id = self._plan_case(t, case, parsed)
        except SpecError as e:
            res["error"] = f"spec: {e}"
            return {"result": res}
        except Exception as e:  # Flink rejected the SQL (ValidationException, ...)
            res["error"] = _java_error(e)
            return {"result": res}
        try:
            if parsed["statement_set"]:
                statement_set = t.create_statement_set()
                for stmt in parsed["inserts"]:
                    statement_set.add_insert_sql(stmt)
                table_result = statement_set.execute()
            else:
                table_result = t.execute_sql(parsed["insert"])
            future = table_result.get_job_client()._j_job_client.getJobExecutionResult()
        except Exception as e:  # rejected by the optimizer (e.g. missing ON CONFLICT)
            self._forget(oracle_id)
            res["error"] = _java_error(e)
            return {"result": res}
        return {"case": case, "result": res, "oracle_id": oracle_id, "future": future,
                "client": table_result.get_job_client(), "started": time.time(),
                "sinks": parsed["sinks"] if parsed["statement_set"] else None}

    def poll(self, job: dict, timeout_s: float) -> dict | None:
        """The case's result once its job has ended (or timed out), else None."""
        future, res = job["future"], job["result"]
        error = None
        if not future.isDone():
            if time.time() - job["started"] < timeout_s:
                return None
            error = f"timed out after {timeout_s:.0f}s"
            try:
                job["client"].cancel().result()
            except Exception:
                pass
        else:
            try:
                future.get()
            except Exception as e:  # the job failed, e.g. ON CONFLICT DO ERROR
                error = _java_error(e)
        self._collect(job["oracle_id"], job["n_batches"], res, error, job["sinks"])
        return res

    def _forget(self, oracle_id: str) -> None:
        try:
            self._coord.takeResult(oracle_id)
        except Exception:
            pass

    def _plan_case(self, t, case: dict, parsed: dict) -> str:
        self._db_counter += 1
        oracle_id = f"tm_case_{self._db_counter}"
        t.execute_sql(f"CREATE DATABASE {oracle_id}")
        t.use_database(oracle_id)
        needs_wm = parsed["strategy"] in ("NOTHING", "ERROR")
        modes, columns = {}, {}
        for name, stmt in parsed["creates"].items():
            opts = {"connector": "tidemark-oracle", "case": oracle_id}
            source = name not in parsed["sinks"]
            if source:
                modes[name] = changelog_mode(stmt)
                opts.update({"table": name, "changelog-mode": modes[name]})
            t.execute_sql(rewrite_create_table(stmt, opts, needs_wm and source))
            if source:
                # the columns a record carries: computed ones (ROWTIME among them) are not
                resolved = t.from_path(name)._j_table.getResolvedSchema()
                columns[name] = [c.getName() for c in resolved.getColumns() if c.isPhysical()]
        for stmt in parsed["passthrough"]:
            t.execute_sql(stmt)
        script = build_script(case["id"], case.get("inputs", {}), columns, modes)
        if parsed["statement_set"]:
            script["sinks"] = parsed["sinks"]
        case["_n_batches"] = len(script["batches"])
        self._coord.register(oracle_id, json.dumps(script))
        return oracle_id

    def _collect(self, oracle_id: str, n_batches: int, res: dict, job_error: str | None,
                 sinks: list[str] | None = None) -> None:
        res["phase"] = "run"
        raw = json.loads(self._coord.takeResult(oracle_id))
        res["changelog"] = raw["changelog"]
        by_sink = {name: [s for s in raw["snapshots"] if s.get("sink") == name] for name in sinks or [None]}
        tables = {name: _tables(snaps, n_batches) for name, snaps in by_sink.items()}
        first = tables[(sinks or [None])[0]]
        res["steps"] = first["steps"]
        complete = raw["released"] == raw["events"] and all(t["final"] is not None for t in tables.values())
        if sinks:
            res["sinks"] = tables
        if complete and job_error is None:
            res["ok"] = True
            res["final"] = first["final"]
        else:
            res["error"] = job_error or "job ended before the case completed"
            res["oracle_state"] = {k: raw[k] for k in ("state", "problems", "released", "events")}


def _tables(snaps: list[dict], n_batches: int) -> dict[str, Any]:
    """One sink's table after each batch and at the end of input (None: never reached)."""
    end = [s for s in snaps if s["watermark"] == 2**63 - 1]
    return {"steps": [sorted(s["table"], key=_sort_key) for s in snaps if 0 < s["watermark"] <= n_batches],
            "final": sorted(end[-1]["table"], key=_sort_key) if end else None}


def _sort_key(row: list) -> str:
    return json.dumps(row, sort_keys=True)


def run_cases(spec: dict, slots: int) -> dict:
    cases = spec.get("cases")
    if not isinstance(cases, list):
        raise SpecError("spec must be an object with a list 'cases'")
    ids = [c.get("id") for c in cases]
    if len(set(ids)) != len(ids) or any(not isinstance(i, str) for i in ids):
        raise SpecError("every case needs a unique string 'id'")
    timeout = float(spec.get("case_timeout_s", DEFAULT_CASE_TIMEOUT_S))
    oracle = Oracle(slots)
    results: dict[str, dict] = {}
    pending = list(cases)
    running: list[dict] = []
    submit_s = 0.0
    while pending or running:
        while pending and len(running) < oracle.slots:
            case = pending.pop(0)
            t0 = time.time()
            job = oracle.submit(case)
            submit_s += time.time() - t0
            if "future" in job:
                job["n_batches"] = case["_n_batches"]
                running.append(job)
            else:
                results[case["id"]] = job["result"]
        still = []
        for job in running:
            res = oracle.poll(job, timeout)
            if res is None:
                still.append(job)
            else:
                results[res["id"]] = res
        if len(still) == len(running) and not (pending and len(still) < oracle.slots):
            time.sleep(0.02)
        running = still
    return {"results": [results[i] for i in ids], "jobs": len(cases),
            "submit_seconds": round(submit_s, 2)}


def main() -> int:
    # the JVM and PyFlink write to stdout; keep it for our JSON alone
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    started = time.time()
    try:
        spec = json.load(sys.stdin)
    except json.JSONDecodeError as e:
        print(f"flink_oracle: stdin is not JSON: {e}", file=sys.stderr)
        return 2
    try:
        jar = build_oracle_jar()
        os.environ["HADOOP_CLASSPATH"] = os.pathsep.join(
            p for p in (str(jar), os.environ.get("HADOOP_CLASSPATH", "")) if p)
        report = run_cases(spec, int(spec.get("slots", DEFAULT_SLOTS)))
    except SpecError as e:
        print(f"flink_oracle: bad spec: {e}", file=sys.stderr)
        return 2
    import pyflink.version

    report["flink_version"] = pyflink.version.__version__
    report["seconds"] = round(time.time() - started, 2)
    json.dump(report, out)
    out.write("\n")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
