"""The index service against the real embedded broker: lookups of absent, present and
deleted keys (primary key and secondary index, upsert and Debezium topics), the offsets
fence (a lookup waits for its offsets, 503 when they do not come), as-of lookups from the
version history, readiness during the initial load, rebuild after a restart, and 4xx for
bad requests."""

from __future__ import annotations

import threading
import uuid

import pytest
from fastapi.testclient import TestClient
from index_support import ddl, produce, upsert

from tidemark.index.app import IndexService, create_app
from tidemark.index.feed import TableFeed
from tidemark.kafka.admin import ensure_topics

pytestmark = pytest.mark.integration
TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def serve(kafka_bootstrap: str):  # noqa: F811
    clients = []

    def start(feed_factory=TableFeed, max_wait_ms: int = 30_000, **kw) -> TestClient:
        service = IndexService(kafka_bootstrap, max_wait_ms=max_wait_ms, feed_factory=feed_factory, **kw)
        client = TestClient(create_app(service, TOKEN))
        client.__enter__()
        clients.append(client)
        return client

    yield start
    for c in clients:
        c.__exit__(None, None, None)


def register(client: TestClient, name: str, topic: str, fmt: str = "upsert-json") -> None:
    r = client.post("/v1/tables", json={"ddl": ddl(name, topic, fmt)}, headers=AUTH)
    assert r.status_code == 201, r.text


def wait_ready(client: TestClient) -> dict:
    for _ in range(600):
        r = client.get("/readyz")
        if r.status_code == 200:
            return r.json()
        threading.Event().wait(0.05)
    raise AssertionError(f"never ready: {r.json()}")


def lookup(client: TestClient, table: str, keys: list, index: str = "PRIMARY", **kw) -> dict:
    r = client.post("/v1/lookup", json={"table": table, "index": index, "keys": keys, **kw}, headers=AUTH)
    assert r.status_code == 200, r.text
    return r.json()


def test_present_absent_and_deleted_keys(serve, kafka_bootstrap: str, make_topic) -> None:  # noqa: F811
    topic = make_topic("t", partitions=2)
    produce(kafka_bootstrap, topic, [upsert(1, 10, "a"), upsert(2, 10, "b"), upsert(3, 20, "c"),
                                     upsert(2, 20, "b2"), ({"id": 3}, None)])
    client = serve()
    register(client, "t", topic)
    wait_ready(client)
    got = lookup(client, "t", [[1], [2], [3], [99]])
    assert got["rows"] == [[[1, 10, "a"]], [[2, 20, "b2"]], [], []]
    by_k = lookup(client, "t", [[10], [20], [30]], index="by_k")["rows"]
    assert by_k == [[[1, 10, "a"]], [[2, 20, "b2"]], []]  # 2 moved to 20, 3 deleted
    assert sum(got["applied_offsets"].values()) == 5
    table = client.get("/v1/tables/t", headers=AUTH).json()
    assert table["rows"] == 2 and table["ready"] is True


def test_debezium_envelopes(serve, kafka_bootstrap: str, make_topic) -> None:  # noqa: F811
    topic = make_topic("d")
    produce(kafka_bootstrap, topic, [
        ({"id": 1}, {"op": "c", "after": {"id": 1, "k": 5, "v": "x"}}),
        ({"id": 2}, {"op": "c", "after": {"id": 2, "k": 5, "v": "y"}}),
        ({"id": 1}, {"op": "u", "before": {"id": 1, "k": 5, "v": "x"}, "after": {"id": 1, "k": 6, "v": "x2"}}),
        ({"id": 2}, {"op": "d", "before": {"id": 2, "k": 5, "v": "y"}}),
        ({"id": 2}, None),  # Debezium's tombstone after a delete: no change
    ])
    client = serve()
    register(client, "d", topic, "debezium-json")
    wait_ready(client)
    assert lookup(client, "d", [[5], [6]], index="by_k")["rows"] == [[], [[1, 6, "x2"]]]


def test_offsets_fence_waits_then_answers_or_times_out(serve, kafka_bootstrap: str, make_topic) -> None:  # noqa: F811
    topic = make_topic("f")
    produce(kafka_bootstrap, topic, [upsert(1, 1, "a")])
    client = serve(max_wait_ms=60_000)
    register(client, "f", topic)
    wait_ready(client)
    r = client.post("/v1/lookup", json={"table": "f", "keys": [[2]], "min_offsets": {"0": 2}, "timeout_ms": 200}, headers=AUTH)
    assert r.status_code == 503
    assert "table 'f': offsets {0: 2} not applied within 200 ms (applied: {0: 1})" in r.json()["detail"]

    result = {}
    waiter = threading.Thread(target=lambda: result.update(
        lookup(client, "f", [[2]], min_offsets={"0": 2}, timeout_ms=30_000)))
    waiter.start()
    produce(kafka_bootstrap, topic, [upsert(2, 1, "b")])
    waiter.join(60)
    assert result["rows"] == [[[2, 1, "b"]]]  # the lookup saw the record it waited for


def test_as_of_lookups_and_release(serve, kafka_bootstrap: str, make_topic) -> None:  # noqa: F811
    topic = make_topic("h")
    produce(kafka_bootstrap, topic, [upsert(1, 1, "v0"), upsert(1, 2, "v1"), ({"id": 1}, None), upsert(1, 3, "v3")])
    client = serve()
    register(client, "h", topic)
    wait_ready(client)
    as_of = [lookup(client, "h", [[1]], as_of={"0": off})["rows"][0] for off in range(5)]
    assert as_of == [[], [[1, 1, "v0"]], [[1, 2, "v1"]], [], [[1, 3, "v3"]]]
    assert lookup(client, "h", [[2]], index="by_k", as_of={"0": 2})["rows"] == [[[1, 2, "v1"]]]
    r = client.post("/v1/tables/h/release", json={"offsets": {"0": 3}}, headers=AUTH)
    assert r.status_code == 200 and r.json()["dropped_versions"] == 3  # v0, v1 and the tombstone
    too_old = client.post("/v1/lookup", json={"table": "h", "keys": [[1]], "as_of": {"0": 2}}, headers=AUTH)
    assert too_old.status_code == 409
    assert "as_of offset 2 of partition 0 is below the released history (kept from offset 3)" in too_old.json()["detail"]
    assert lookup(client, "h", [[1]], as_of={"0": 3})["rows"] == [[]]
    assert lookup(client, "h", [[1]], as_of={"0": 4})["rows"] == [[[1, 3, "v3"]]]


class GatedFeed(TableFeed):
    """Holds the initial load at its first batch until the test opens the gate."""

    gate = threading.Event()

    def _apply(self, msgs):
        GatedFeed.gate.wait(60)
        super()._apply(msgs)


def test_not_ready_until_the_initial_load_caught_up(serve, kafka_bootstrap: str, make_topic) -> None:  # noqa: F811
    topic = make_topic("r")
    produce(kafka_bootstrap, topic, [upsert(i, i % 3, "x") for i in range(50)])
    GatedFeed.gate.clear()
    client = serve(feed_factory=GatedFeed)
    assert client.get("/readyz").status_code == 200  # no tables: nothing to wait for
    register(client, "r", topic)
    r = client.get("/readyz")
    assert r.status_code == 503 and r.json()["loading"] == ["r"]
    assert client.get("/healthz").status_code == 200
    GatedFeed.gate.set()
    assert wait_ready(client) == {"status": "ready", "tables": ["r"]}
    assert client.get("/v1/tables/r", headers=AUTH).json()["rows"] == 50


def test_restart_rebuilds_from_the_topic(serve, kafka_bootstrap: str, make_topic) -> None:  # noqa: F811
    topic = make_topic("s")
    produce(kafka_bootstrap, topic, [upsert(1, 1, "a"), upsert(2, 1, "b"), ({"id": 1}, None)])
    first = serve()
    register(first, "s", topic)
    wait_ready(first)
    before = lookup(first, "s", [[1]], index="by_k")
    first.__exit__(None, None, None)  # the service stops; its index is gone
    second = serve()
    register(second, "s", topic)
    wait_ready(second)
    assert lookup(second, "s", [[1]], index="by_k") == before == {"rows": [[[2, 1, "b"]]], "applied_offsets": {"0": 3}}


def test_bad_requests_are_4xx_with_a_message(serve, kafka_bootstrap: str, make_topic) -> None:  # noqa: F811
    topic = make_topic("b")
    client = serve()
    assert client.post("/v1/tables", json={"ddl": ddl("b", topic)}).status_code == 401
    assert client.post("/v1/tables", json={"ddl": "DROP TABLE x"}, headers=AUTH).status_code == 400
    r = client.post("/v1/tables", json={"ddl": "CREATE TABLE n (id BIGINT) WITH ('format' = 'json')"}, headers=AUTH)
    assert r.status_code == 400 and "has no PRIMARY KEY" in r.json()["detail"]
    r = client.post("/v1/tables", json={"ddl": ddl("b", topic).replace("'k')", "'nope')")}, headers=AUTH)
    assert r.status_code == 400 and "names unknown column 'nope'" in r.json()["detail"]
    register(client, "b", topic)
    register(client, "b", topic)  # the same definition again: no-op
    r = client.post("/v1/tables", json={"ddl": ddl("b", topic + "x")}, headers=AUTH)
    assert r.status_code == 409
    cases = [
        ({"table": "zz", "keys": [[1]]}, 404, "no table 'zz' is registered"),
        ({"table": "b", "index": "nope", "keys": [[1]]}, 400, "table 'b' has no index 'nope'"),
        ({"table": "b", "keys": [[1, 2]]}, 400, "keys[0]: index 'PRIMARY' has 1 column(s), got 2 value(s)"),
        ({"table": "b", "keys": [["abc"]]}, 400, "keys[0]: expected BIGINT"),
        ({"table": "b", "keys": "nope"}, 400, "keys"),
        ({"table": "b", "keys": [[1]], "timeout_ms": -1}, 400, "timeout_ms"),
    ]
    for body, status, message in cases:
        r = client.post("/v1/lookup", json=body, headers=AUTH)
        assert r.status_code == status, (body, r.text)
        assert message in r.json()["detail"], (body, r.json())
    huge = client.post("/v1/lookup", content=b"x" * (5 * 1024 * 1024), headers={"content-type": "application/json"})
    assert huge.status_code == 413


def test_a_table_whose_topic_did_not_exist_loads_once_created_and_registered_again(
        serve, kafka_bootstrap: str) -> None:  # noqa: F811
    topic = f"not-yet-{uuid.uuid4().hex[:8]}"  # no such topic (yet)
    client = serve()
    register(client, "late", topic)
    r = wait_for_status(client, lambda r: "does not exist" in str(r.json().get("failed", {})))
    assert r.status_code == 503 and f"topic '{topic}' does not exist" in r.json()["failed"]["late"]
    fenced = client.post("/v1/lookup", json={"table": "late", "keys": [[1]], "min_offsets": {"0": 1}}, headers=AUTH)
    assert fenced.status_code == 503 and "does not exist" in fenced.json()["detail"]  # at once, saying why
    ensure_topics(kafka_bootstrap, {topic: 1})
    produce(kafka_bootstrap, topic, [upsert(1, 7, "x")])
    register(client, "late", topic)  # 201, as before; now it loads
    assert wait_ready(client) == {"status": "ready", "tables": ["late"]}
    assert lookup(client, "late", [[1]])["rows"] == [[[1, 7, "x"]]]
    assert client.get("/v1/tables/late", headers=AUTH).json()["error"] is None


@pytest.mark.parametrize("backoff_s, register_again", [((0.1, 0.2), False), ((300.0, 300.0), True)],
                         ids=["retried-by-itself", "registering-again-cuts-the-backoff"])
def test_a_missing_topic_is_retried_with_backoff(serve, kafka_bootstrap: str,  # noqa: F811
                                                  backoff_s, register_again) -> None:
    topic = f"not-yet-{uuid.uuid4().hex[:8]}"  # no such topic (yet)
    client = serve(load_backoff_s=backoff_s)
    register(client, "late", topic)
    wait_for_status(client, lambda r: "retrying in" in str(r.json().get("failed", {})))
    ensure_topics(kafka_bootstrap, {topic: 2})
    if register_again:
        register(client, "late", topic)
    assert wait_ready(client) == {"status": "ready", "tables": ["late"]}


class FailsOnceFeed(TableFeed):
    """The first feed of a table stops on an error while loading (a decoder bug, say)."""

    failures = 0

    def _apply(self, msgs):
        if FailsOnceFeed.failures == 0:
            FailsOnceFeed.failures += 1
            raise RuntimeError("boom while loading")
        super()._apply(msgs)


def test_a_table_that_failed_while_loading_is_loaded_again_when_registered_again(
        serve, kafka_bootstrap: str, make_topic) -> None:  # noqa: F811
    topic = make_topic("f")
    produce(kafka_bootstrap, topic, [upsert(1, 1, "a")])
    FailsOnceFeed.failures = 0
    client = serve(feed_factory=FailsOnceFeed)
    register(client, "f", topic)
    r = wait_for_status(client, lambda r: r.json().get("failed"))
    assert r.json()["failed"] == {"f": "RuntimeError: boom while loading"}
    register(client, "f", topic)
    assert wait_ready(client) == {"status": "ready", "tables": ["f"]}
    assert lookup(client, "f", [[1]])["rows"] == [[[1, 1, "a"]]]


def wait_for_status(client: TestClient, cond, timeout_s: float = 30.0):
    for _ in range(int(timeout_s / 0.05)):
        r = client.get("/readyz")
        if cond(r):
            return r
        threading.Event().wait(0.05)
    raise AssertionError(f"/readyz never matched: {r.text}")
