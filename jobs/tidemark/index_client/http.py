"""The delta join's ``lookup`` callable over HTTP: one ``POST /v1/lookup`` per call (a
batch of keys; a batch larger than the service takes is sent as several requests), rows
decoded back into Python values with the table's column types. Used by hosts that run the
stage away from the data (Spark tasks).

A lookup that must wait for its offsets takes one of the service's few waiting slots; when
none is free the service answers 429 at once, and the lookup is sent again with jittered
exponential backoff for up to ``timeout_s`` (the slots free up as fences are reached)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import httpx
import tenacity

from tidemark.engine.catalog import TableDef
from tidemark.engine.errors import TidemarkError
from tidemark.engine.types import coerce_value, to_json_value
from tidemark.index_client import MAX_LOOKUP_KEYS


class IndexLookupError(TidemarkError):
    exit_status = 1


class IndexUnreachable(IndexLookupError):
    """No HTTP answer from the index service (refused connection, timeout, DNS)."""


class IndexRegistrationRefused(IndexLookupError):
    """The index service answered ``POST /v1/tables`` with an error status."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class HttpLookup:
    def __init__(self, url: str, tables: Mapping[str, TableDef], token: str | None = None, timeout_s: float = 60.0):
        self.url = url.rstrip("/")
        self.tables = dict(tables)
        self.token = token
        self.timeout_s = timeout_s
        self._client: httpx.Client | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_client": None}

    @property
    def client(self) -> httpx.Client:
        if self._client is None:
            headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
            self._client = httpx.Client(base_url=self.url, headers=headers, timeout=self.timeout_s)
        return self._client

    def __call__(
        self,
        table: str,
        index: str,
        keys: Sequence[tuple],
        min_offsets: Mapping[int, int] | None = None,
        as_of: Mapping[int, int] | None = None,
    ) -> list[list[tuple[tuple, tuple]]]:
        tdef = self.tables[table]
        found: list[list[tuple[tuple, tuple]]] = []
        for start in range(0, len(keys), MAX_LOOKUP_KEYS):
            found += self._lookup_chunk(table, tdef, index, keys[start:start + MAX_LOOKUP_KEYS], min_offsets, as_of)
        return found

    def _lookup_chunk(
        self,
        table: str,
        tdef: TableDef,
        index: str,
        keys: Sequence[tuple],
        min_offsets: Mapping[int, int] | None,
        as_of: Mapping[int, int] | None,
    ) -> list[list[tuple[tuple, tuple]]]:
        body = {
            "table": table,
            "index": index,
            "keys": [[_json(v) for v in k] for k in keys],
            "min_offsets": {str(p): o for p, o in (min_offsets or {}).items()} or None,
            "as_of": {str(p): o for p, o in (as_of or {}).items()} if as_of is not None else None,
        }
        resp = self._post_lookup(body)
        if resp.status_code != 200:
            try:
                detail = resp.json().get("detail")
            except ValueError:
                detail = resp.text
            raise IndexLookupError(f"index lookup on '{table}' failed ({resp.status_code}): {detail}")
        types = tdef.types
        return [
            [(tuple(coerce_value(t, v) for t, v in zip(types, row)), ()) for row in per_key]
            for per_key in resp.json()["rows"]
        ]

    def _post_lookup(self, body: dict) -> httpx.Response:
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_result(lambda resp: resp.status_code == 429),
            wait=tenacity.wait_exponential_jitter(multiplier=0.05, max=2.0, jitter=0.1),
            stop=tenacity.stop_after_delay(self.timeout_s),
            retry_error_callback=lambda state: state.outcome.result(),  # the last 429, reported as such
        )
        return retrying(self.client.post, "/v1/lookup", json=body)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def register(self, table: TableDef | str, ddl: str, history: bool = True) -> dict:
        """``POST /v1/tables``; the service's description of the table. Raises
        ``IndexUnreachable`` when no answer came, ``IndexRegistrationRefused`` (with the
        status and the service's message) when it said no."""
        name = table if isinstance(table, str) else table.name
        try:
            resp = self.client.post("/v1/tables", json={"ddl": ddl, "history": history})
        except httpx.TransportError as exc:
            raise IndexUnreachable(f"index service at {self.url} is unreachable ({type(exc).__name__}: {exc})") from exc
        if resp.status_code not in (200, 201):
            try:
                detail = resp.json().get("detail")
            except ValueError:
                detail = resp.text
            raise IndexRegistrationRefused(resp.status_code, f"index service at {self.url} refused table '{name}' "
                                                             f"({resp.status_code}): {detail}")
        return resp.json()


def _json(value):
    """Key values as JSON (the service coerces them with the index columns' types)."""
    from datetime import date, datetime
    from decimal import Decimal

    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    return value


__all__ = ["HttpLookup", "IndexLookupError", "IndexRegistrationRefused", "IndexUnreachable", "to_json_value"]
