"""Start a Spark standalone cluster (one master, one worker) on this machine, from the
pyspark distribution, and ship the tidemark package to its executors.

Why this exists: the job must run unchanged on a real cluster (``--master spark://...``),
where executors are separate JVMs with their own Python workers, and nothing in a
``local[*]`` run proves that (one JVM, the driver's own interpreter, the package already
importable). A loopback cluster is the cheapest real thing: separate master, worker and
executor processes, tasks shipped over RPC, the package delivered as a ``--py-files``
archive. Tests use it; so can a user who wants to try the cluster path without installing
Spark (``python -m tidemark.spark.cluster start``).

The pip-installed pyspark has ``bin/spark-class`` but not the ``sbin/start-*.sh`` scripts,
so master and worker are started as ``spark-class org.apache.spark.deploy.master.Master`` /
``...worker.Worker``. Everything binds to 127.0.0.1 on free ports. Each daemon runs in its
own process group (the worker's group also holds the executor JVMs and their Python
workers), so ``stop()`` can end all of them, and the kernel kills the daemons if the
process that started them dies (``PR_SET_PDEATHSIG``): no orphans.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import tempfile
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tidemark.engine.errors import TidemarkError

STARTUP_TIMEOUT_S = 120.0
#: Spark refuses executors below ~450 MiB (300 MiB reserved * 1.5).
EXECUTOR_MEMORY_MB = 512
LOOPBACK = "127.0.0.1"


class ClusterError(TidemarkError):
    """The local standalone cluster could not be started; the message has the log tail."""

    exit_status = 6


def spark_home() -> str:
    """The Spark distribution pyspark ships (``$SPARK_HOME`` if set)."""
    from pyspark.find_spark_home import _find_spark_home

    return _find_spark_home()


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """preexec_fn: SIGKILL this daemon when the process that started it goes away."""
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def package_archive(dest: str | Path) -> str:
    """Write a zip of the ``tidemark`` package (both source roots, ``jobs/`` and
    ``services/``, merged as the wheel merges them) and return its path.

    This is what ``--py-files`` / ``spark.submit.pyFiles`` ship to executors. It holds
    only tidemark's own code: its dependencies (pyspark, confluent-kafka, pyarrow...) have
    native parts and must be installed in the executors' Python (the tidemark image does).
    """
    import tidemark

    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    written: set[str] = set()
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for root in tidemark.__path__:  # namespace package: one entry per source root
            root_path = Path(root)
            for path in sorted(root_path.rglob("*")):
                if "__pycache__" in path.parts or not path.is_file():
                    continue
                if path.suffix not in (".py", ".proto", ".avsc", ".json"):
                    continue
                name = "tidemark/" + path.relative_to(root_path).as_posix()
                if name in written:  # the first root wins, as it does on sys.path
                    continue
                # zipimport finds a namespace package (no __init__.py) only through an
                # explicit directory entry, so every parent directory gets one.
                parts = name.split("/")[:-1]
                for depth in range(1, len(parts) + 1):
                    directory = "/".join(parts[:depth]) + "/"
                    if directory not in written:
                        zf.writestr(zipfile.ZipInfo(directory), b"")
                        written.add(directory)
                zf.write(path, name)
                written.add(name)
    os.replace(tmp, dest)
    return str(dest)


def _wait_group_gone(pgid: int, timeout_s: float = 15.0) -> bool:
    """Wait until no process of group ``pgid`` exists (killed executors are reaped by
    init a moment after the kill), so a stopped cluster really is gone."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


@dataclass
class LocalStandaloneCluster:
    """One master and one worker on loopback; use as a context manager.

    ``master_url`` (``spark://127.0.0.1:PORT``) is set once started. ``driver_conf()``
    is what a driver needs to use the cluster from this machine; ``submit_args()`` is the
    same as ``PYSPARK_SUBMIT_ARGS`` for a driver started as a subprocess (``tidemark run``).
    """

    cores: int = 2
    worker_memory_mb: int = 1024
    executor_memory_mb: int = EXECUTOR_MEMORY_MB
    workdir: str | None = None
    master_url: str | None = None
    master_web_url: str | None = None
    archive: str | None = None
    _procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    _tmp: tempfile.TemporaryDirectory | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> LocalStandaloneCluster:
        if self.workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="tidemark-cluster-")
            self.workdir = self._tmp.name
        os.makedirs(self.workdir, exist_ok=True)
        self.archive = package_archive(os.path.join(self.workdir, "tidemark-py.zip"))
        try:
            port, web = free_port(), free_port()
            self._spawn("master", "org.apache.spark.deploy.master.Master",
                        ["--host", LOOPBACK, "--port", str(port), "--webui-port", str(web)])
            self.master_url = f"spark://{LOOPBACK}:{port}"
            self.master_web_url = f"http://{LOOPBACK}:{web}"
            self._wait(lambda s: s.get("status") == "ALIVE", "the master to come up")
            self._spawn("worker", "org.apache.spark.deploy.worker.Worker", [
                "--host", LOOPBACK, "--port", str(free_port()),
                "--webui-port", str(free_port()),
                "--cores", str(self.cores), "--memory", f"{self.worker_memory_mb}m",
                "--work-dir", os.path.join(self.workdir, "work"),
                self.master_url,
            ])
            self._wait(lambda s: s.get("aliveworkers", 0) >= 1, "the worker to register")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Worker first (its group holds the executors), then the master: SIGTERM lets
        the worker kill its executors; SIGKILL of the whole group after a grace period."""
        for name in ("worker", "master"):
            proc = self._procs.pop(name, None)
            if proc is None:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            with contextlib.suppress(ProcessLookupError):  # executors, Python daemons
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
            _wait_group_gone(proc.pid)
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> LocalStandaloneCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ for drivers
    def driver_conf(self) -> dict[str, str]:
        """Spark conf for a driver on this machine: loopback addresses (executors
        connect back to the driver), executor size within the worker, the package."""
        assert self.master_url and self.archive, "cluster not started"
        return {
            "spark.driver.host": LOOPBACK,
            "spark.driver.bindAddress": LOOPBACK,
            "spark.executor.memory": f"{self.executor_memory_mb}m",
            "spark.executor.cores": str(self.cores),
            "spark.cores.max": str(self.cores),
            "spark.submit.pyFiles": self.archive,
        }

    def submit_args(self) -> str:
        """``PYSPARK_SUBMIT_ARGS`` carrying ``driver_conf()``: pyspark passes it to
        spark-submit when it launches the driver JVM, so any pyspark program (``tidemark
        run`` included) picks it up without a flag of its own."""
        conf = self.driver_conf()
        py_files = conf.pop("spark.submit.pyFiles")
        parts = [f"--conf {k}={v}" for k, v in conf.items()]
        return " ".join([*parts, f"--py-files {py_files}", "pyspark-shell"])

    def driver_env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """Environment for a driver subprocess that uses this cluster."""
        env = dict(os.environ if base is None else base)
        env["PYSPARK_SUBMIT_ARGS"] = self.submit_args()
        env["SPARK_LOCAL_IP"] = LOOPBACK
        env["TIDEMARK_SPARK_MASTER"] = self.master_url or ""
        return env

    @property
    def process_groups(self) -> list[int]:
        """Process group ids of the running daemons (the worker's holds its executors)."""
        return [proc.pid for proc in self._procs.values()]

    def state(self) -> dict:
        """The master's JSON status (workers, apps)."""
        import httpx

        return httpx.get(f"{self.master_web_url}/json/", timeout=5).json()

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = os.path.join(self.workdir or "", f"{name}.log")
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return "(no log)"

    # ------------------------------------------------------------------ internals
    def _spawn(self, name: str, main_class: str, args: list[str]) -> None:
        home = spark_home()
        conf = os.path.join(self.workdir, f"{name}.properties")
        with open(conf, "w", encoding="utf-8") as f:
            # no REST submission server: it would take the fixed port 6066
            f.write("spark.master.rest.enabled false\n")
        env = dict(os.environ)
        env.update(
            SPARK_HOME=home,
            SPARK_LOCAL_IP=LOOPBACK,
            SPARK_DAEMON_MEMORY="256m",
            SPARK_NO_DAEMONIZE="1",
        )
        log = open(os.path.join(self.workdir, f"{name}.log"), "wb")  # noqa: SIM115
        try:
            self._procs[name] = subprocess.Popen(
                [os.path.join(home, "bin", "spark-class"), main_class, *args,
                 "--properties-file", conf],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                start_new_session=True, preexec_fn=_die_with_parent,
            )
        finally:
            log.close()

    def _wait(self, ready, what: str) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            for name, proc in self._procs.items():
                if proc.poll() is not None:
                    raise ClusterError(
                        f"Spark {name} exited (status {proc.returncode}) while waiting for "
                        f"{what}; last log lines:\n{self.log_tail(name)}"
                    )
            try:
                if ready(self.state()):
                    return
            except Exception:  # web UI not up yet
                pass
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"timed out after {STARTUP_TIMEOUT_S:.0f}s waiting for {what}; "
                    f"master log:\n{self.log_tail('master')}\nworker log:\n{self.log_tail('worker')}"
                )
            time.sleep(0.5)


@contextlib.contextmanager
def local_cluster(cores: int = 2, worker_memory_mb: int = 1024) -> Iterator[LocalStandaloneCluster]:
    """``with local_cluster() as c: ... c.master_url ...``"""
    cluster = LocalStandaloneCluster(cores=cores, worker_memory_mb=worker_memory_mb)
    with cluster:
        yield cluster


def _cli():
    """``python -m tidemark.spark.cluster start|archive``."""
    import typer

    cli = typer.Typer(add_completion=False, no_args_is_help=True,
                      help="A loopback Spark standalone cluster, and the package archive for executors.")

    @cli.command()
    def start(cores: int = 2, worker_memory_mb: int = 1024) -> None:
        """Start a master and one worker on 127.0.0.1 until Ctrl-C; print the driver's settings."""
        with local_cluster(cores=cores, worker_memory_mb=worker_memory_mb) as cluster:
            typer.echo(f"master: {cluster.master_url}  (web UI {cluster.master_web_url})")
            typer.echo(f"export SPARK_LOCAL_IP={LOOPBACK}")
            typer.echo(f"export PYSPARK_SUBMIT_ARGS='{cluster.submit_args()}'")
            typer.echo("Ctrl-C stops the cluster.", err=True)
            with contextlib.suppress(KeyboardInterrupt):
                while True:
                    time.sleep(3600)

    @cli.command()
    def archive(path: str) -> None:
        """Write the tidemark package as a zip for --py-files / spark.submit.pyFiles."""
        typer.echo(package_archive(path))

    return cli


if __name__ == "__main__":
    _cli()()
