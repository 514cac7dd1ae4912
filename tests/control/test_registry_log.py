"""The registry state machine, fed records directly: the rules every service applies alike."""

from __future__ import annotations

from tidemark.control.registry_log import LeaseRecord, PipelineRecord, RegistryState

UID = "0123456789abcdef0123456789abcdef"


def pipeline(version: int, desired: str = "stopped", rid: str = "", sql: str = "SQL", name: str = "p") -> bytes:
    return PipelineRecord(name=name, sql=sql, options={}, desired=desired, version=version, uid=UID,
                          request_id=rid or f"p{version}{desired}{sql}", created_at=0, updated_at=0).to_value()


def lease(owner: str, op: str, ts: float, rid: str, ttl: float = 10) -> bytes:
    return LeaseRecord(owner=owner, op=op, ts=ts, ttl=ttl, request_id=rid).to_value()


def test_first_create_wins_and_updates_need_the_next_version():
    s = RegistryState()
    s.apply("p", pipeline(1, sql="A", rid="a"))
    s.apply("p", pipeline(1, sql="B", rid="b"))  # a racing create of the same name loses
    assert s.pipelines["p"].sql == "A" and s.accepted == {"a": True, "b": False}
    s.apply("p", pipeline(2, "running", rid="up1"))
    s.apply("p", pipeline(2, "stopped", rid="up2"))  # written against the same version: loses
    assert s.pipelines["p"].desired == "running" and not s.accepted["up2"]
    s.apply("p", None)
    assert "p" not in s.pipelines
    s.apply("p", pipeline(7, rid="after-compaction"))  # unknown name: any version (history compacted)
    assert s.pipelines["p"].version == 7


def test_a_repeated_record_does_not_change_a_known_outcome():
    s = RegistryState()
    s.apply("p", pipeline(1, rid="a"))
    s.apply("p", pipeline(1, rid="a"))  # the repair write re-publishes the accepted record
    assert s.accepted["a"] is True and s.pipelines["p"].version == 1


def test_lease_goes_to_the_first_claim_in_log_order():
    s = RegistryState(grace_s=1)
    s.apply("lease/p", lease("A", "claim", 100, "a1"))
    s.apply("lease/p", lease("B", "claim", 100.5, "b1"))
    assert s.accepted == {"a1": True, "b1": False}
    assert s.lease_holder("p", now=105) == "A"
    s.apply("lease/p", lease("A", "renew", 105, "a2"))  # renewal moves expiry to 115
    s.apply("lease/p", lease("B", "claim", 112, "b2"))  # the old expiry (110) no longer counts
    assert not s.accepted["b2"] and s.lease_holder("p", now=114) == "A"


def test_an_expired_lease_can_be_taken_and_the_old_owner_cannot_renew_it_back():
    s = RegistryState(grace_s=1)
    s.apply("lease/p", lease("A", "claim", 100, "a1"))
    s.apply("lease/p", lease("B", "claim", 110.5, "b0"))  # expired at 110, but within the grace
    assert not s.accepted["b0"]
    s.apply("lease/p", lease("B", "claim", 111, "b1"))
    assert s.accepted["b1"] and s.lease_holder("p", now=112) == "B"
    s.apply("lease/p", lease("A", "renew", 112, "a2"))  # A was partitioned away: it has lost
    assert not s.accepted["a2"] and s.lease_holder("p", now=112) == "B"
    assert s.lease_holder("p", now=121) is None  # B stopped renewing: nobody holds it


def test_release_frees_the_lease_at_once_and_only_the_owner_can_release():
    s = RegistryState()
    s.apply("lease/p", lease("A", "claim", 100, "a1"))
    s.apply("lease/p", lease("B", "release", 101, "b-rel"))
    assert not s.accepted["b-rel"] and s.lease_holder("p", now=101) == "A"
    s.apply("lease/p", lease("A", "release", 101, "a-rel"))
    assert s.lease_holder("p", now=101) is None
    s.apply("lease/p", lease("B", "claim", 101.1, "b1"))
    assert s.lease_holder("p", now=102) == "B"


def test_garbage_records_are_skipped_not_fatal():
    s = RegistryState()
    s.apply("p", b"{not json")
    s.apply("lease/p", b'{"owner": "A"}')
    s.apply("q", pipeline(1, name="p"))  # a record under another name's key
    s.apply("q", pipeline(1, name="q"))
    assert s.skipped == 3 and list(s.pipelines) == ["q"]


def test_records_that_break_the_apis_rules_are_skipped_with_their_reason():
    """Only records the API could have written are applied: whatever else lands in the
    topic (a sink pointed at it, a hand-written record) is skipped, and the rest loads."""
    good = pipeline(1, name="ok")

    def edited(**changes) -> bytes:
        import json

        return json.dumps({**json.loads(good), **changes}).encode()

    planned: list[str] = []

    def sql_check(sql: str) -> None:
        planned.append(sql)
        if sql == "NOT SQL":
            raise ValueError("does not plan")

    s = RegistryState(sql_check=sql_check)
    bad = {
        "uid": edited(uid="/../../../x"),
        "name": edited(name="../x"),
        "desired": edited(desired="now"),
        "version": edited(version=True),
        "options": edited(options={"max_records_per_trigger": True}),
        "sql": edited(sql="NOT SQL"),
    }
    for field, value in bad.items():
        assert field in (s.apply("ok", value) or ""), field
    assert s.apply("../x", edited(name="../x")) is not None  # a key that names no pipeline
    assert s.apply("lease/ok", LeaseRecord(owner="A", op="steal", ts=1, ttl=1).to_value()) is not None
    assert s.skipped == 8 and not s.pipelines and not s.leases
    assert s.apply("ok", good) is None  # the bad records did not block this one
    assert list(s.pipelines) == ["ok"] and s.pipelines["ok"].uid == UID and planned[-1] == "SQL"


def test_sql_bytes_follow_registrations_updates_and_deletes():
    s = RegistryState()
    s.apply("a", pipeline(1, name="a", sql="é" * 10))  # bytes, not characters
    s.apply("b", pipeline(1, name="b", sql="x" * 5))
    s.apply("a", pipeline(2, name="a", sql="y" * 3))
    assert s.sql_bytes == 3 + 5
    s.apply("b", None)
    assert s.sql_bytes == 3
