"""A real ``tidemark index`` process under attack: every ``/v1`` endpoint
needs the token (``TIDEMARK_INDEX_TOKEN``), far-future fence waits cannot starve normal
lookups (unauthenticated ones are 401 at once, authenticated ones beyond ``--max-waiters``
429 at once), and malformed JSON bodies are 422 with a message, with or without a token."""

from __future__ import annotations

import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from index_support import PROCESS_TOKEN, ddl, produce, upsert

from tidemark.engine.sql import _table_def, parse_statements
from tidemark.index_client import MAX_LOOKUP_KEYS
from tidemark.index_client.http import HttpLookup

pytestmark = pytest.mark.integration

FAR_FUTURE = {"0": 10**12}


def registered(index_process, kafka_bootstrap: str, make_topic, *args: str):
    """A process with table ``t`` (row 1) loaded."""
    topic = make_topic("t")
    produce(kafka_bootstrap, topic, [upsert(1, 10, "a")])
    proc = index_process(*args)
    r = proc.client.post("/v1/tables", json={"ddl": ddl("t", topic)})
    assert r.status_code == 201, r.text
    proc.wait_ready()
    return proc


def test_every_v1_endpoint_needs_the_token(index_process, kafka_bootstrap, make_topic):
    proc = registered(index_process, kafka_bootstrap, make_topic)
    calls = [("GET", "/v1/tables", None), ("GET", "/v1/tables/t", None),
             ("POST", "/v1/lookup", {"table": "t", "keys": [[1]]}),
             ("POST", "/v1/tables", {"ddl": "CREATE TABLE x (id BIGINT)"}),
             ("POST", "/v1/tables/t/release", {"offsets": {"0": 1}})]
    for method, path, body in calls:
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            r = proc.anon.request(method, path, json=body, headers=headers)
            assert r.status_code == 401, (method, path, r.text)
            assert r.json() == {"detail": "missing or wrong bearer token"}
            assert "rows" not in r.text
    for path in ("/healthz", "/readyz", "/metrics"):  # probes and scrapes stay open
        assert proc.anon.get(path).status_code == 200, path
    got = proc.client.post("/v1/lookup", json={"table": "t", "keys": [[1]]})
    assert got.status_code == 200 and got.json()["rows"] == [[[1, 10, "a"]]]


def test_unauthenticated_far_future_waits_are_refused_at_once(index_process, kafka_bootstrap, make_topic):
    proc = registered(index_process, kafka_bootstrap, make_topic)
    body = {"table": "t", "keys": [[1]], "min_offsets": FAR_FUTURE, "timeout_ms": 30_000}
    start = time.monotonic()
    with ThreadPoolExecutor(60) as pool:
        statuses = list(pool.map(lambda _: proc.anon.post("/v1/lookup", json=body).status_code, range(60)))
    assert statuses == [401] * 60
    assert time.monotonic() - start < 10  # on the unprotected service: 30 s (every one waited)


def test_waiting_lookups_cannot_starve_a_normal_lookup(index_process, kafka_bootstrap, make_topic):
    proc = registered(index_process, kafka_bootstrap, make_topic, "--max-wait-ms", "8000", "--max-waiters", "8")
    body = {"table": "t", "keys": [[1]], "min_offsets": FAR_FUTURE}
    results: list[tuple[int, float, str]] = []

    def wait_far() -> None:
        t0 = time.monotonic()
        r = proc.client.post("/v1/lookup", json=body)
        results.append((r.status_code, time.monotonic() - t0, r.json()["detail"]))

    threads = [threading.Thread(target=wait_far) for _ in range(60)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 10
    while len(results) < 52 and time.monotonic() < deadline:  # the 52 beyond the 8 slots answer at once
        time.sleep(0.05)
    t0 = time.monotonic()
    normal = proc.client.post("/v1/lookup", json={"table": "t", "keys": [[1]], "min_offsets": {"0": 1}})
    took = time.monotonic() - t0
    metrics = proc.anon.get("/metrics").text
    for t in threads:
        t.join(30)
    assert normal.status_code == 200 and normal.json()["rows"] == [[[1, 10, "a"]]]
    assert took < 2, f"a normal lookup took {took:.1f} s behind 60 waiting ones"
    assert re.search(r"^tidemark_index_waiting_lookups 8\.0$", metrics, re.M), metrics
    refused = [r for r in results if r[0] == 429]
    timed_out = [r for r in results if r[0] == 503]
    assert len(refused) == 52 and len(timed_out) == 8, sorted({(s, d) for s, _, d in results})
    assert all(secs < 5 for _, secs, _ in refused)
    assert "table 't': 8 lookups are already waiting for offsets (--max-waiters); retry later" in refused[0][2]
    assert all(secs >= 7.5 for _, secs, _ in timed_out)  # they waited their --max-wait-ms


@pytest.mark.parametrize("with_token", [False, True], ids=["no-token", "token"])
def test_malformed_json_bodies_are_422_with_a_message(index_process, kafka_bootstrap, make_topic, with_token):
    proc = registered(index_process, kafka_bootstrap, make_topic)
    client = proc.client if with_token else proc.anon
    bodies = {
        b'{"table": "\\ud800", "keys": [[1]]}': "unexpected end of hex escape at line 1 column",
        b'{"table": "t", "keys": [["\\udfff"]]}': "lone leading surrogate in hex escape at line 1 column 32",
        b'{"table": "t", "keys": [[NaN]]}': "expected value at line 1 column 26",
        b'{"table": "t", "keys": [[1]], "timeout_ms": Infinity}': "expected value at line 1 column 45",
        b'{"table": "t", "keys": ' + b"[" * 100_000: "recursion limit exceeded",
        b'{"table": "t", "keys": [[1]]': "EOF while parsing",
        b'\xff{}': "expected value at line 1 column 1",
        b'{"table": "t", "keys": [[1e999]]}': "a number is too large for a 64-bit float",
    }
    for body, message in bodies.items():
        r = client.post("/v1/lookup", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 422, (body[:60], r.text)
        detail = r.json()["detail"]
        assert detail.startswith("request body is not valid JSON") and message in detail, (body[:60], detail)
    assert "Traceback" not in proc.log.read_text()


def test_the_jobs_client_retries_while_every_waiting_slot_is_taken(index_process, kafka_bootstrap, make_topic):
    """``HttpLookup`` (what a job's tasks look rows up with): a fenced lookup answered 429
    (the one waiting slot is taken) is sent again until the slot is free."""
    topic = make_topic("w")
    produce(kafka_bootstrap, topic, [upsert(1, 10, "a")])
    proc = index_process("--max-waiters", "1")
    text = ddl("w", topic)
    assert proc.client.post("/v1/tables", json={"ddl": text}).status_code == 201
    proc.wait_ready()
    holder = ThreadPoolExecutor(1).submit(proc.client.post, "/v1/lookup", json={
        "table": "w", "keys": [[1]], "min_offsets": {"0": 2}, "timeout_ms": 20_000})
    deadline = time.monotonic() + 10
    while "tidemark_index_waiting_lookups 1.0" not in proc.anon.get("/metrics").text:
        assert time.monotonic() < deadline, "the first lookup never waited"
        time.sleep(0.05)
    client = HttpLookup(proc.url, {"w": _table_def(parse_statements(text)[0])}, token=PROCESS_TOKEN, timeout_s=30)
    second = ThreadPoolExecutor(1).submit(client, "w", "PRIMARY", [(2,)], min_offsets={0: 2})
    time.sleep(1.0)
    assert not second.done()  # refused, and trying again
    produce(kafka_bootstrap, topic, [upsert(2, 20, "b")])
    assert second.result(20) == [[((2, 20, "b"), ())]]
    assert holder.result(20).status_code == 200
    client.close()
    refused = re.search(r'^tidemark_index_lookups_total\{outcome="too_many_waiters",table="w"\} (\S+)$',
                        proc.anon.get("/metrics").text, re.M)
    assert refused and float(refused.group(1)) >= 1


def test_the_jobs_client_splits_a_lookup_larger_than_one_request_may_carry(index_process, kafka_bootstrap,
                                                                          make_topic):
    """A delta join's batch can touch more join keys than one ``POST /v1/lookup`` may carry
    (the service answers 422 past ``MAX_LOOKUP_KEYS``): ``HttpLookup`` sends it in several
    requests and answers every key, in order."""
    proc = registered(index_process, kafka_bootstrap, make_topic)
    text = ddl("t", "unused")
    client = HttpLookup(proc.url, {"t": _table_def(parse_statements(text)[0])}, token=PROCESS_TOKEN)
    keys = [(k,) for k in range(MAX_LOOKUP_KEYS + 5, 0, -1)]  # key 1 (the loaded row) last
    found = client("t", "PRIMARY", keys)
    client.close()
    assert len(found) == len(keys)
    assert found[-1] == [((1, 10, "a"), ())]
    assert all(rows == [] for rows in found[:-1])
