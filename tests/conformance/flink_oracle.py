"""Flink 2.3 as a conformance oracle: run Tidemark pipeline SQL on a changelog, report the sink.

Run with the Flink venv's python (``$TIDEMARK_FLINK_PYTHON``, default
``/work/main/.venv-flink/bin/python``) as a subprocess. It reads a JSON job spec on stdin::

    {"cases": [{"id": "c1",
                "sql": "CREATE TABLE s1 (...) WITH (...); ...; INSERT INTO t ... ON CONFLICT DO ...;",
                "inputs": {"s1": [[{"kind": "+I", "row": {...} | [...], "seq": 3}, ...], ...], ...},
                "options": {"table.exec.sink.upsert-materialize-strategy.type": "LEGACY"},
                "isolate": false}]}

``inputs`` maps each source table to its batches (all tables have the same number of batches;
a shorter list is padded with empty batches). Inside a batch, records of all tables are fed to
Flink in ``seq`` order (then table by table, as listed), which is the source-position order
Tidemark uses for "latest". It writes on stdout::

    {"flink_version": "2.3.0", "results": [{"id": "c1", "ok": true, "error": null,
      "steps": [[row, ...] after batch 1, ...], "final": [row, ...], "changelog": [...]}]}

where a row is a JSON list in the sink's column order and ``steps[i]`` is the sink table after
batch ``i+1`` (rows sorted). ``ok`` is false when Flink rejected the SQL or the job failed (e.g.
``ON CONFLICT DO ERROR``); ``steps`` then holds the batches completed before the failure.

How it stays deterministic (see ``docs/conformance.md``): every table of the SQL is re-pointed
at the ``tidemark-oracle`` connector (Java, in ``oracle_java/``, compiled here with javac on
first use). Its sources release one global record sequence in lockstep, proven drained by
aligned checkpoints whenever the next record belongs to another table, and end each batch with
watermark ``i`` on every source; its sink materializes the upsert stream Flink writes and
snapshots the table on every watermark. Many cases run as one Flink job (one database each), so
the ~10 s JVM/mini-cluster start-up is paid once per subprocess, not per case.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
JAVA_SRC = HERE / "oracle_java" / "src"
KINDS = ("+I", "-U", "+U", "-D")
ROWTIME = "__tidemark_rowtime"
DEFAULT_CHUNK = 24
DEFAULT_CASE_TIMEOUT_S = 120

BASE_CONFIG = {
    "parallelism.default": "1",
    # checkpoints are the oracle's "record processed everywhere" signal (aligned by default)
    "execution.checkpointing.interval": "10 ms",
    "execution.checkpointing.min-pause": "0 ms",
    "restart-strategy.type": "none",
    # flush every record at once: the lockstep waits on each step, buffering only adds latency
    "execution.buffer-timeout.interval": "0 ms",
    "taskmanager.memory.network.min": "256mb",
    "taskmanager.memory.network.max": "256mb",
    "taskmanager.memory.segment-size": "4kb",
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
_CONFLICT_RE = re.compile(r"\bON\s+CONFLICT\s+DO\s+(NOTHING|ERROR|DEDUPLICATE)\b", re.I)


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
    """Statements of one case: SET options, CREATE TABLEs (name -> statement), the INSERT."""
    sets: dict[str, str] = {}
    creates: dict[str, str] = {}
    insert = None
    for stmt in split_statements(sql):
        if m := _SET_RE.match(stmt):
            sets[m.group(1)] = m.group(2)
        elif m := _CREATE_RE.match(stmt):
            creates[_unquote(m.group(1))] = stmt
        elif m := _INSERT_RE.match(stmt):
            if insert is not None:
                raise SpecError("more than one INSERT statement")
            insert = (_unquote(m.group(1)), stmt)
        else:
            raise SpecError(f"unsupported statement: {stmt[:80]}")
    if insert is None:
        raise SpecError("no INSERT INTO statement")
    sink, insert_stmt = insert
    if sink not in creates:
        raise SpecError(f"INSERT INTO {sink}: table not created")
    conflict = _CONFLICT_RE.search(insert_stmt)
    return {
        "sets": sets,
        "creates": creates,
        "sink": sink,
        "insert": insert_stmt,
        "strategy": conflict.group(1).upper() if conflict else None,
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
    sources = sorted(JAVA_SRC.rglob("*.java")) + sorted(JAVA_SRC.rglob("META-INF/services/*"))
    digest = hashlib.sha256()
    lib = flink_lib_dir()
    digest.update(str(lib).encode())
    for f in sources:
        digest.update(f.relative_to(JAVA_SRC).as_posix().encode())
        digest.update(f.read_bytes())
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tidemark-flink-oracle"
    jar = cache / f"tidemark-oracle-{digest.hexdigest()[:16]}.jar"
    if jar.exists():
        return jar
    cache.mkdir(parents=True, exist_ok=True)
    classpath = os.pathsep.join(str(p) for p in sorted(lib.glob("*.jar")))
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        java_files = [str(f) for f in sources if f.suffix == ".java"]
        for tool in ("javac", "jar"):
            if subprocess.run(["which", tool], capture_output=True).returncode != 0:
                raise RuntimeError(f"the Flink oracle needs a JDK 17 ({tool} not found on PATH)")
        r = subprocess.run(["javac", "-nowarn", "-d", tmp, "-cp", classpath, *java_files],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"compiling the oracle connector failed:\n{r.stderr}")
        services = Path(tmp) / "META-INF" / "services"
        services.mkdir(parents=True)
        for f in JAVA_SRC.glob("META-INF/services/*"):
            (services / f.name).write_bytes(f.read_bytes())
        partial = jar.with_suffix(".tmp")
        subprocess.run(["jar", "cf", str(partial), "-C", tmp, "."], check=True)
        partial.replace(jar)
    return jar


def _java_error(exc: BaseException) -> str:
    """The innermost meaningful message of a py4j/Flink exception, without stack frames."""
    text = str(exc)
    causes = re.findall(r"(?:Caused by: |^: |\n: )([\w.$]+(?:Exception|Error)[^\n]*)", text)
    msg = causes[-1] if causes else text.strip().splitlines()[0]
    return msg.strip()


# --------------------------------------------------------------------------------------------
# Running cases
# --------------------------------------------------------------------------------------------

class Oracle:
    def __init__(self) -> None:
        from pyflink.java_gateway import get_gateway
        from pyflink.table import EnvironmentSettings, TableEnvironment

        self._settings = EnvironmentSettings.in_streaming_mode()
        self._table_env_cls = TableEnvironment
        self._coord = get_gateway().jvm.tidemark.flinkoracle.Coordinator
        self._db_counter = 0

    def _new_env(self, options: dict[str, str]):
        t = self._table_env_cls.create(self._settings)
        conf = t.get_config()
        for k, v in {**BASE_CONFIG, **options}.items():
            conf.set(k, v)
        return t

    def run_job(self, cases: list[dict], options: dict[str, str], timeout_s: float) -> list[dict]:
        """Run ``cases`` as one Flink job. Returns a result per case (same order)."""
        t = self._new_env(options)
        stmt_set = t.create_statement_set()
        results: dict[str, dict] = {}
        planned: list[dict] = []
        for case in cases:
            res = {"id": case["id"], "ok": False, "error": None, "phase": "plan", "steps": [],
                   "final": None, "changelog": []}
            results[case["id"]] = res
            try:
                self._plan_case(t, stmt_set, case)
                planned.append(case)
            except SpecError as e:
                res["error"] = f"spec: {e}"
            except Exception as e:  # Flink rejected the SQL (ValidationException, ...)
                res["error"] = _java_error(e)
                self._forget(case)
        if planned:
            try:
                result = stmt_set.execute()
            except Exception as e:  # the optimizer rejected one of the INSERTs
                error = _java_error(e)
                for case in planned:
                    self._forget(case)
                    results[case["id"]]["error"] = error
                    # with several cases we cannot tell whose INSERT it was: the caller retries
                    results[case["id"]]["phase"] = "plan" if len(planned) == 1 else "job-plan"
                return [results[c["id"]] for c in cases]
            job_error = None
            try:
                result.wait(int(timeout_s * 1000))
            except Exception as e:
                job_error = _java_error(e)
                if "TimeoutException" in str(e):
                    job_error = f"timed out after {timeout_s:.0f}s"
                    try:
                        result.get_job_client().cancel().get()
                    except Exception:
                        pass
            for case in planned:
                self._collect(case, results[case["id"]], job_error)
        return [results[c["id"]] for c in cases]

    def _forget(self, case: dict) -> None:
        try:
            self._coord.takeResult(case["oracle_id"])
        except Exception:
            pass

    def _plan_case(self, t, stmt_set, case: dict) -> None:
        parsed = parse_case_sql(case["sql"])
        self._db_counter += 1
        db = f"tm_case_{self._db_counter}"
        case["oracle_id"] = f"{db}"
        t.execute_sql(f"CREATE DATABASE {db}")
        t.use_database(db)
        needs_wm = parsed["strategy"] in ("NOTHING", "ERROR")
        modes, columns = {}, {}
        for name, stmt in parsed["creates"].items():
            opts = {"connector": "tidemark-oracle", "case": case["oracle_id"]}
            if name != parsed["sink"]:
                modes[name] = changelog_mode(stmt)
                opts.update({"table": name, "changelog-mode": modes[name]})
            t.execute_sql(rewrite_create_table(stmt, opts, needs_wm and name != parsed["sink"]))
            if name != parsed["sink"]:
                columns[name] = [c for c in t.from_path(name).get_schema().get_field_names()
                                 if c != ROWTIME]
        script = build_script(case["id"], case.get("inputs", {}), columns, modes)
        case["n_batches"] = len(script["batches"])
        self._coord.register(case["oracle_id"], json.dumps(script))
        stmt_set.add_insert_sql(parsed["insert"])

    def _collect(self, case: dict, res: dict, job_error: str | None) -> None:
        res["phase"] = "run"
        raw = json.loads(self._coord.takeResult(case["oracle_id"]))
        snaps = raw["snapshots"]
        steps = [sorted(s["table"], key=_sort_key) for s in snaps if 0 < s["watermark"] <= case["n_batches"]]
        res["steps"] = steps
        res["changelog"] = raw["changelog"]
        complete = raw["released"] == raw["events"] and any(
            s["watermark"] == 2**63 - 1 for s in snaps)
        if complete:
            res["ok"] = True
            res["final"] = sorted(snaps[-1]["table"], key=_sort_key)
        else:
            res["error"] = job_error or "job ended before the case completed"


def _sort_key(row: list) -> str:
    return json.dumps(row, sort_keys=True)


def _group_key(case: dict) -> tuple:
    parsed_sets = {}
    try:
        parsed_sets = parse_case_sql(case["sql"])["sets"]
    except SpecError:
        pass
    opts = {**parsed_sets, **case.get("options", {})}
    return tuple(sorted(opts.items()))


def run_cases(spec: dict, chunk: int = DEFAULT_CHUNK) -> dict:
    cases = spec.get("cases")
    if not isinstance(cases, list):
        raise SpecError("spec must be an object with a list 'cases'")
    ids = [c.get("id") for c in cases]
    if len(set(ids)) != len(ids) or any(not isinstance(i, str) for i in ids):
        raise SpecError("every case needs a unique string 'id'")
    oracle = Oracle()
    timeout = float(spec.get("case_timeout_s", DEFAULT_CASE_TIMEOUT_S))
    groups: dict[tuple, list[dict]] = {}
    for c in cases:
        groups.setdefault(_group_key(c), []).append(c)
    results: dict[str, dict] = {}
    jobs = 0
    for key, group in groups.items():
        options = dict(key)
        alone = [c for c in group if c.get("isolate")]
        shared = [c for c in group if not c.get("isolate")]
        batches = [[c] for c in alone] + [shared[i:i + chunk] for i in range(0, len(shared), chunk)]
        for batch in batches:
            jobs += 1
            out = oracle.run_job(batch, options, timeout * (1 + len(batch) / 4))
            for c, r in zip(batch, out):
                results[c["id"]] = r
            # a failing case (DO ERROR) takes its whole job down: rerun the others on their own
            if len(batch) > 1:
                for c, r in zip(batch, out):
                    if not r["ok"] and r["phase"] in ("run", "job-plan"):
                        jobs += 1
                        results[c["id"]] = oracle.run_job([c], options, timeout)[0]
    return {"results": [results[i] for i in ids], "jobs": jobs}


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
        report = run_cases(spec, int(spec.get("chunk", DEFAULT_CHUNK)))
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
