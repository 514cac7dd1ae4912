"""A seeded Nexmark event generator: the same events, as JSON rows, for Tidemark and for Flink.

It follows the shape of Nexmark's own generator (``nexmark-flink``, ``generator/model``) in
what the queries depend on, so that their filters and joins select a realistic share of rows:

- event ``i`` is a person, an auction or a bid by its position in a cycle of
  ``sum(proportions)`` events (Nexmark's default 1:3:46);
- ids count from 1000 (``FIRST_PERSON_ID``, ``FIRST_AUCTION_ID``); with Nexmark's default
  ratios a bid goes to a *hot* auction (the first of the last block of 100) 1 time in 2, else
  to one of the 100 auctions in flight; its bidder is hot (the second person of the last
  block of 100) 3 times in 4, else one of the 1000 active people; a seller is hot 3 times
  in 4. Unlike Nexmark, a reference never points past the newest person or auction (Nexmark
  lets it lead by up to 10 ids), so every bid and auction can find its partner;
- prices are ``round(10 ** (u * 6) * 100)`` (100 .. 100,000,000; q14's and q15's ranges);
  categories 10..14 (q3, q20 select 10); states include OR, ID and CA (q3);
- half the bids come from the hot channels Google, Facebook, Baidu, Apple, the rest from
  ``channel-N`` whose url carries ``&channel_id=...`` 9 times in 10 (q21's REGEXP_EXTRACT);
  every url has three directory levels (q22's SPLIT_INDEX);
- event time advances ``interval_ms`` per event from ``start``; ``jitter_ms`` moves each
  event up to that much earlier, out of order. It must stay below the 4 s the queries'
  ``WATERMARK ... - INTERVAL '4' SECOND`` allows, so that no event is late: then the final
  tables do not depend on when watermarks advance, and Flink's are a deterministic oracle.

The same ``(seed, n_events, options)`` always gives the same events.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass
from datetime import datetime, timedelta

FIRST_PERSON_ID = 1000
FIRST_AUCTION_ID = 1000
FIRST_CATEGORY_ID = 10
NUM_CATEGORIES = 5
#: hot ids are the first (auctions, sellers) or second (bidders) of each block of this many
HOT_BLOCK = 100
#: a pick is hot unless ``randrange(odds) == 0`` (NexmarkConfiguration's hot*Ratio defaults)
HOT_AUCTION_ODDS = 2
HOT_BIDDER_ODDS = 4
HOT_SELLER_ODDS = 4
#: how many of the newest auctions / persons a "cold" pick chooses from
IN_FLIGHT_AUCTIONS = 100
ACTIVE_PEOPLE = 1000
HOT_CHANNELS = ("Google", "Facebook", "Baidu", "Apple")
CHANNELS = 10_000
US_STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
US_CITIES = ("Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend",
             "Redmond", "Seattle", "Kent", "Cheyenne")
FIRST_NAMES = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah",
               "Deiter", "Walter")
LAST_NAMES = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones",
              "Noris")
#: the queries' watermark delay; jitter at or beyond it would make events late
WATERMARK_DELAY_MS = 4000
DEFAULT_START = datetime(2015, 7, 15, 0, 0, 0)
TABLES = ("person", "auction", "bid")


@dataclass(frozen=True)
class Event:
    """One generated record: the topic (``person``, ``auction`` or ``bid``) and its JSON row."""

    table: str
    row: dict


def _timestamp(t: datetime) -> str:
    """The JSON text Flink's and Tidemark's ``TIMESTAMP(3)`` both read."""
    return t.strftime("%Y-%m-%d %H:%M:%S.") + f"{t.microsecond // 1000:03d}"


class _Generator:
    def __init__(self, seed: int, proportions: tuple[int, int, int], interval_ms: int,
                 jitter_ms: int, start: datetime) -> None:
        self.rng = random.Random(seed)
        self.proportions = proportions
        self.interval_ms = interval_ms
        self.jitter_ms = jitter_ms
        self.start = start
        self.persons = 0
        self.auctions = 0
        self.hot_urls = [self._base_url() for _ in HOT_CHANNELS]
        self._channel_urls: dict[int, str] = {}

    def _word(self, n: int) -> str:
        return "".join(self.rng.choice(string.ascii_lowercase) for _ in range(n))

    def _base_url(self) -> str:
        return (f"https://www.nexmark.com/{self._word(5)}/{self._word(5)}/{self._word(5)}"
                "/item.htm?query=1")

    def _channel(self) -> tuple[str, str]:
        if self.rng.randrange(2) > 0:
            i = self.rng.randrange(len(HOT_CHANNELS))
            return HOT_CHANNELS[i], self.hot_urls[i]
        n = self.rng.randrange(CHANNELS)
        if n not in self._channel_urls:
            # Nexmark's channel cache: a fixed url per channel, with its id 9 times in 10
            url = self._base_url()
            if self.rng.randrange(10) > 0:
                url += f"&channel_id={abs(_reverse_int32(n))}"
            self._channel_urls[n] = url
        return f"channel-{n}", self._channel_urls[n]

    def _price(self) -> int:
        return round(10.0 ** (self.rng.random() * 6.0) * 100.0)

    def _hot_or_recent(self, count: int, hot_odds: int, recent: int, offset: int = 0) -> int:
        """A base-0 id among ``count`` entities: the hot one of the newest block, or one of the
        newest ``recent``."""
        if count and self.rng.randrange(hot_odds) > 0:
            return min(count - 1, ((count - 1) // HOT_BLOCK) * HOT_BLOCK + offset)
        return max(0, count - 1 - self.rng.randrange(min(count, recent) or 1))

    def event(self, i: int) -> Event:
        t = self.start + timedelta(milliseconds=i * self.interval_ms)
        if self.jitter_ms:
            t -= timedelta(milliseconds=self.rng.randrange(self.jitter_ms + 1))
        p, a, _ = self.proportions
        offset = i % sum(self.proportions)
        if offset < p:
            return self._person(t)
        if offset < p + a:
            return self._auction(t)
        return self._bid(t)

    def _person(self, t: datetime) -> Event:
        rng = self.rng
        row = {
            "id": FIRST_PERSON_ID + self.persons,
            "name": f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}",
            "emailAddress": f"{self._word(7)}@{self._word(5)}.com",
            "creditCard": " ".join(f"{rng.randrange(10000):04d}" for _ in range(4)),
            "city": rng.choice(US_CITIES),
            "state": rng.choice(US_STATES),
            "dateTime": _timestamp(t),
            "extra": self._word(rng.randrange(1, 8)),
        }
        self.persons += 1
        return Event("person", row)

    def _auction(self, t: datetime) -> Event:
        rng = self.rng
        initial = self._price()
        row = {
            "id": FIRST_AUCTION_ID + self.auctions,
            "itemName": self._word(rng.randrange(3, 10)),
            "description": self._word(rng.randrange(5, 20)),
            "initialBid": initial,
            "reserve": initial + self._price(),
            "dateTime": _timestamp(t),
            "expires": _timestamp(t + timedelta(milliseconds=rng.randrange(1, 21) * 1000)),
            "seller": FIRST_PERSON_ID + self._hot_or_recent(self.persons, HOT_SELLER_ODDS, ACTIVE_PEOPLE),
            "category": FIRST_CATEGORY_ID + rng.randrange(NUM_CATEGORIES),
            "extra": self._word(rng.randrange(1, 8)),
        }
        self.auctions += 1
        return Event("auction", row)

    def _bid(self, t: datetime) -> Event:
        channel, url = self._channel()
        row = {
            "auction": FIRST_AUCTION_ID + self._hot_or_recent(self.auctions, HOT_AUCTION_ODDS, IN_FLIGHT_AUCTIONS),
            # the second person of the block, so hot bidders and hot sellers differ
            "bidder": FIRST_PERSON_ID + self._hot_or_recent(self.persons, HOT_BIDDER_ODDS, ACTIVE_PEOPLE, 1),
            "price": self._price(),
            "channel": channel,
            "url": url,
            "dateTime": _timestamp(t),
            "extra": self._word(self.rng.randrange(1, 8)),
        }
        return Event("bid", row)


def _reverse_int32(n: int) -> int:
    """Java's ``Integer.reverse``: Nexmark derives a channel's id from it."""
    bits = int(f"{n & 0xFFFFFFFF:032b}"[::-1], 2)
    return bits - (1 << 32) if bits >= 1 << 31 else bits


def generate(seed: int, n_events: int, *, proportions: tuple[int, int, int] = (1, 3, 46),
             interval_ms: int = 100, jitter_ms: int = 0,
             start: datetime = DEFAULT_START) -> list[Event]:
    """``n_events`` Nexmark events in generation (source) order."""
    if n_events < 0:
        raise ValueError(f"n_events must be >= 0, got {n_events}")
    if len(proportions) != 3 or min(proportions) < 0 or sum(proportions) == 0:
        raise ValueError(f"proportions must be three counts >= 0, not all 0: {proportions}")
    if not 0 <= jitter_ms < WATERMARK_DELAY_MS:
        raise ValueError(f"jitter_ms must be in [0, {WATERMARK_DELAY_MS}) (the queries' watermark "
                         f"delay), got {jitter_ms}")
    if interval_ms < 0:
        raise ValueError(f"interval_ms must be >= 0, got {interval_ms}")
    gen = _Generator(seed, proportions, interval_ms, jitter_ms, start)
    return [gen.event(i) for i in range(n_events)]


def split_batches(events: list[Event], n_batches: int) -> list[list[Event]]:
    """Consecutive, nearly equal slices: the micro-batches both systems are fed."""
    if n_batches < 1:
        raise ValueError(f"n_batches must be >= 1, got {n_batches}")
    size, extra = divmod(len(events), n_batches)
    out, at = [], 0
    for b in range(n_batches):
        n = size + (1 if b < extra else 0)
        out.append(events[at:at + n])
        at += n
    return out


def side_input(n_keys: int = 10_000) -> list[dict]:
    """q13's side table (Nexmark ships it as a file): key ``k`` -> value ``str(k)``."""
    return [{"key": k, "value": str(k)} for k in range(n_keys)]
