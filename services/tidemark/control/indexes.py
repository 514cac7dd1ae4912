"""Registers the tables a delta-join pipeline needs with the index service.

A delta join keeps no join state: its job looks the other side up in the index service, so
that service must follow each delta-join side's source table before the job's first batch.
The control service does it twice: when the pipeline is registered (so a pipeline whose
indexes cannot be set up is refused with a clear message instead of failing later), and
before each start of its job (an index service that restarted, or an embedded one started
by another control service's process, has forgotten its tables; registering the same
definition again is a no-op there).

Where the index service is: ``--index-url`` (token in ``TIDEMARK_INDEX_TOKEN``), else one
embedded ``tidemark index`` process owned by this control service (``index_process``).

Errors map to what the client can act on: the index service unreachable or refusing our
token -> ``IndexUnavailable`` (502); the table already registered there with another
definition -> ``IndexConflict`` (409); the table refused as such -> ``IndexRejected`` (422).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path

from tidemark.control.index_process import EmbeddedIndex, EmbeddedIndexError
from tidemark.engine.pipeline import Pipeline
from tidemark.index_client import INDEX_TOKEN_ENV
from tidemark.index_client.http import HttpLookup, IndexRegistrationRefused, IndexUnreachable
from tidemark.index_client.pipeline_tables import IndexedTable, indexed_tables

log = logging.getLogger("tidemark.control.indexes")



class IndexUnavailable(Exception):
    """No usable index service (unreachable, refused our token, failed to start): 502."""


class IndexConflict(Exception):
    """The index service already follows a table of that name with another definition: 409."""


class IndexRejected(Exception):
    """The index service refused the table definition itself: 422."""


@dataclass(frozen=True)
class IndexBinding:
    """Where a pipeline's job finds its indexes."""

    url: str
    token: str | None
    tables: tuple[str, ...]
    embedded: bool

    def job_args(self) -> list[str]:
        return ["--index-url", self.url]

    def job_env(self) -> dict[str, str]:
        """The token travels in the environment: a command line is visible to every user."""
        return {INDEX_TOKEN_ENV: self.token} if self.token else {}


@dataclass
class IndexRegistrar:
    bootstrap_servers: str
    index_url: str | None
    index_token: str | None
    workdir: Path
    timeout_s: float = 10.0
    _embedded: EmbeddedIndex | None = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    @property
    def embedded(self) -> EmbeddedIndex | None:
        return self._embedded

    def ensure(self, name: str, pipeline: Pipeline) -> IndexBinding | None:
        """Register every delta-join side's table; None when the pipeline has no delta join."""
        tables = indexed_tables(pipeline)
        if not tables:
            return None
        url, token, embedded = self._service()
        client = HttpLookup(url, {}, token=token, timeout_s=self.timeout_s)
        try:
            for table in tables:
                self._register(client, name, table)
        finally:
            client.close()
        log.info("pipeline %s: tables %s registered with the index service at %s", name,
                 ", ".join(t.name for t in tables), url)
        return IndexBinding(url, token, tuple(t.name for t in tables), embedded)

    def _service(self) -> tuple[str, str | None, bool]:
        if self.index_url:
            return self.index_url.rstrip("/"), self.index_token, False
        with self._lock:
            if self._embedded is None:
                self._embedded = EmbeddedIndex(self.bootstrap_servers, self.workdir)
        try:
            return self._embedded.ensure(), self._embedded.token, True
        except EmbeddedIndexError as exc:
            raise IndexUnavailable(f"{exc} (log: {self._embedded.log_path}); or give the control service "
                                   "--index-url") from None

    def _register(self, client: HttpLookup, name: str, table: IndexedTable) -> None:
        why = f"pipeline '{name}' needs table '{table.name}' in the index service for its delta join"
        try:
            client.register(table.name, table.ddl, history=table.history)
        except IndexUnreachable as exc:
            raise IndexUnavailable(f"{why}, but {exc}") from None
        except IndexRegistrationRefused as exc:
            if exc.status == 409:
                raise IndexConflict(f"{why}: {exc} (the index service follows one table per name; "
                                    "rename the table in this pipeline or use the same definition)") from None
            if exc.status in (400, 404, 422):
                raise IndexRejected(f"{why}: {exc}") from None
            hint = f"; set {INDEX_TOKEN_ENV} to its token" if exc.status in (401, 403) else ""
            raise IndexUnavailable(f"{why}: {exc}{hint}") from None

    def close(self) -> None:
        if self._embedded is not None:
            self._embedded.close()
