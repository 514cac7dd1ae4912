"""The Nexmark generator: deterministic per seed, Nexmark's proportions and distributions."""

from __future__ import annotations

import re
import sys
from collections import Counter
from datetime import datetime
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import generator  # noqa: E402  (sibling module, not a package)


def _time(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S.%f")


def test_same_seed_same_events_other_seed_other_events() -> None:
    assert generator.generate(7, 500) == generator.generate(7, 500)
    assert generator.generate(7, 500) != generator.generate(8, 500)


def test_default_proportions_are_nexmarks_1_3_46() -> None:
    counts = Counter(e.table for e in generator.generate(1, 5000))
    assert counts == {"person": 100, "auction": 300, "bid": 4600}


def test_custom_proportions() -> None:
    counts = Counter(e.table for e in generator.generate(1, 100, proportions=(1, 1, 0)))
    assert counts == {"person": 50, "auction": 50}


def test_ids_count_from_1000_and_references_point_to_existing_rows() -> None:
    events = generator.generate(3, 3000)
    persons, auctions = set(), set()
    for e in events:
        if e.table == "person":
            assert e.row["id"] == 1000 + len(persons)
            persons.add(e.row["id"])
        elif e.table == "auction":
            assert e.row["id"] == 1000 + len(auctions)
            assert e.row["seller"] in persons
            auctions.add(e.row["id"])
        else:
            assert e.row["auction"] in auctions
            assert e.row["bidder"] in persons


def test_event_time_is_monotone_without_jitter() -> None:
    times = [_time(e.row["dateTime"]) for e in generator.generate(2, 1000, interval_ms=10)]
    assert times == sorted(times)
    assert (times[-1] - times[0]).total_seconds() == pytest.approx(9.99)


def test_jitter_reorders_but_never_beyond_the_watermark_delay() -> None:
    events = generator.generate(2, 2000, interval_ms=10, jitter_ms=3000)
    times = [_time(e.row["dateTime"]) for e in events]
    assert times != sorted(times)
    high = times[0]
    for t in times:
        assert (high - t).total_seconds() < 4.0
        high = max(high, t)


def test_jitter_at_the_watermark_delay_is_refused() -> None:
    with pytest.raises(ValueError, match="jitter_ms must be in"):
        generator.generate(1, 10, jitter_ms=4000)


def test_value_distributions_cover_what_the_queries_filter_on() -> None:
    events = generator.generate(5, 20000)
    bids = [e.row for e in events if e.table == "bid"]
    auctions = [e.row for e in events if e.table == "auction"]
    persons = [e.row for e in events if e.table == "person"]
    prices = [b["price"] for b in bids]
    assert 100 <= min(prices) and max(prices) <= 100_000_000
    # q15-q17's three price ranks and q14's band all occur
    assert any(p < 10_000 for p in prices) and any(10_000 <= p < 1_000_000 for p in prices)
    assert any(p >= 1_000_000 for p in prices)
    assert any(1_000_000 < 0.908 * p < 50_000_000 for p in prices)
    # q21: the four hot channels (about half) and channel-N, most with a channel_id in the url
    channels = Counter(b["channel"] for b in bids)
    hot = sum(channels[c] for c in generator.HOT_CHANNELS)
    assert 0.4 < hot / len(bids) < 0.6
    cold = [b for b in bids if b["channel"].startswith("channel-")]
    with_id = [b for b in cold if re.search(r"(&|^)channel_id=([^&]*)", b["url"])]
    assert 0.8 < len(with_id) / len(cold) < 1.0
    # q22: three directory levels in every url
    assert all(len(b["url"].split("/")) >= 6 for b in bids)
    # q3 / q20: category 10 and the states OR, ID, CA
    assert {a["category"] for a in auctions} == {10, 11, 12, 13, 14}
    assert {"OR", "ID", "CA"} <= {p["state"] for p in persons}
    # most bids go to hot auctions: far fewer distinct auctions than bids
    assert len({b["auction"] for b in bids}) < len(bids) / 10
    assert all(_time(a["expires"]) > _time(a["dateTime"]) for a in auctions)


def test_channel_id_is_javas_integer_reverse() -> None:
    assert generator._reverse_int32(1) == -(2 ** 31)
    assert generator._reverse_int32(2) == 2 ** 30


def test_split_batches_keeps_order_and_sizes() -> None:
    events = generator.generate(1, 10)
    batches = generator.split_batches(events, 3)
    assert [len(b) for b in batches] == [4, 3, 3]
    assert [e for b in batches for e in b] == events
