"""A warm Flink mini-cluster that runs benchmark jobs one at a time, on request.

``flink_runner.run(jobs)`` runs a fixed list of jobs in one subprocess. The suite wants to
alternate systems (Flink, Tidemark, Flink, ...) so both see the same machine load, and
starting Flink's JVM and mini-cluster for every run costs about a minute on the shared
2-core machine. So this file keeps one ``flink_runner.Runner`` alive and feeds it one job
(a ``flink_runner.job_spec``) per JSON line on stdin, answering each with the runner's
report line on stdout. Measurement is entirely ``flink_runner``'s (see its docstring).

- ``FlinkSession`` (client, stdlib only: the suite uses it from the Tidemark venv);
- ``main()`` (run with the Flink venv's python): the server loop.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import flink_runner  # noqa: E402


class FlinkSessionError(RuntimeError):
    pass


class FlinkSession:
    """Client: starts the server with the Flink venv's python; ``run(job)`` -> report."""

    def __init__(self, workdir: Path, python: str | None = None, timeout_s: float = 900.0,
                 java_options: str | None = None):
        """``java_options``: extra JVM flags for the gateway JVM (``JAVA_TOOL_OPTIONS``; the
        quick smoke run's short-run flags), none by default."""
        workdir.mkdir(parents=True, exist_ok=True)
        self.log = workdir / "flink.log"
        python = python or os.environ.get("TIDEMARK_FLINK_PYTHON", str(flink_runner.DEFAULT_FLINK_PYTHON))
        env = dict(os.environ)
        if java_options:
            env["JAVA_TOOL_OPTIONS"] = f"{env.get('JAVA_TOOL_OPTIONS', '')} {java_options}".strip()
        with open(self.log, "wb") as err:
            self.proc = subprocess.Popen([python, str(Path(__file__).resolve())], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=err, text=True, bufsize=1,
                                         start_new_session=True, env=env)
        ready = self._reply(timeout_s)
        self.startup_s = float(ready["jvm_start_seconds"])
        self.flink_version = ready["flink_version"]

    def _reply(self, timeout_s: float) -> dict[str, Any]:
        box: list[str] = []
        reader = threading.Thread(target=lambda: box.append(self.proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(timeout_s)
        if not box or not box[0]:
            tail = self.log.read_text(encoding="utf-8", errors="replace")[-2000:]
            status = self.proc.poll()
            self.close()
            why = f"exited with status {status}" if status is not None else f"did not answer in {timeout_s:.0f} s"
            raise FlinkSessionError(f"the Flink session {why}; {self.log}:\n{tail}")
        return json.loads(box[0])

    def run(self, job: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        return self._reply(float(job.get("timeout_s", 1800)) + 120)

    def close(self) -> None:
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> FlinkSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def main() -> int:
    out = os.fdopen(os.dup(1), "w", buffering=1)  # the JVM writes to stdout; keep ours for replies
    os.dup2(2, 1)
    jar = flink_runner.build_jar()
    os.environ["HADOOP_CLASSPATH"] = os.pathsep.join(p for p in (str(jar), os.environ.get("HADOOP_CLASSPATH", "")) if p)
    t0 = time.time()
    runner = flink_runner.Runner()
    import pyflink.version

    out.write(json.dumps({"jvm_start_seconds": round(time.time() - t0, 2),
                          "flink_version": pyflink.version.__version__}) + "\n")
    for line in sys.stdin:
        if line.strip():
            job = json.loads(line)
            print(f"flink_session: {job['id']} ...", file=sys.stderr, flush=True)
            try:
                res = runner.run_job(job)
            except Exception as e:  # reported to the suite, which fails loudly
                res = {"id": job["id"], "ok": False, "error": f"{type(e).__name__}: {e}"}
            out.write(json.dumps(res) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
