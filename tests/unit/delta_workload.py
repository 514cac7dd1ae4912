"""Random CDC workloads for delta join tests: batches of source changes for two tables
``a(id, k, v)`` and ``b(id, k, w)`` (primary key ``id``, join on ``k``), with inserts,
updates that change the join key, and deletes on the sides allowed to delete. With
``reverts``, a side may also put a row back as it was at the start of the batch (an update
back, a re-insert): its changes then cancel, which a record-by-record join (Flink's, and
the regular join) still shows downstream as a refresh ``-U X``/``+U X`` at the later
position; random updates alone almost never produce that."""

from __future__ import annotations

import random

from tidemark.engine.changelog import Change

DDL = """
CREATE TABLE a (id BIGINT, k BIGINT, v BIGINT, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('topic' = 'a', 'format' = 'debezium-json', 'index.by_k.columns' = 'k');
CREATE TABLE b (id BIGINT, k BIGINT, w BIGINT, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('topic' = 'b', 'format' = '{b_format}', 'index.by_k.columns' = 'k');
CREATE TABLE t (aid BIGINT, bid BIGINT, v BIGINT, w BIGINT, PRIMARY KEY (aid, bid) NOT ENFORCED)
  WITH ('topic' = 't', 'format' = 'upsert-json');
"""


def sql(strategy: str, consistency: str = "eventual", *, b_format: str = "debezium-json", join: str = "JOIN",
        where: str = "", residual: str = "", cache: str = "true", cache_size: int = 10000) -> str:
    sets = (
        f"SET 'table.optimizer.delta-join.strategy' = '{strategy}';\n"
        f"SET 'table.exec.delta-join.consistency' = '{consistency}';\n"
        f"SET 'table.exec.delta-join.cache-enabled' = '{cache}';\n"
        f"SET 'table.exec.delta-join.left.cache-size' = '{cache_size}';\n"
        f"SET 'table.exec.delta-join.right.cache-size' = '{cache_size}';\n"
    )
    on = "a.k = b.k" + (f" AND {residual}" if residual else "")
    return (
        sets + DDL.format(b_format=b_format)
        + f"INSERT INTO t SELECT a.id, b.id, a.v, b.w FROM a {join} b ON {on} {where} ON CONFLICT DO DEDUPLICATE;"
    )


class Side:
    def __init__(self, rng: random.Random, base: int, keys: int, deletes: bool, updates: bool,
                 reverts: bool = False):
        self.rng, self.keys, self.deletes, self.updates = rng, keys, deletes, updates
        self.reverts = reverts and updates
        self.rows: dict[int, tuple] = {}
        self.at_batch_start: dict[int, tuple] = {}
        self.next_id = base

    def start_batch(self) -> None:
        self.at_batch_start = dict(self.rows)

    def revert(self, pos: tuple) -> list[Change]:
        """Put one row changed in this batch back as it was at the batch start."""
        changed = sorted(pk for pk in self.at_batch_start.keys() | self.rows.keys()
                         if self.at_batch_start.get(pk) != self.rows.get(pk)
                         and (self.deletes or pk in self.rows))
        if not changed:
            return []
        pk = self.rng.choice(changed)
        old, new = self.rows.get(pk), self.at_batch_start.get(pk)
        if new is None:
            del self.rows[pk]
            return [Change("-D", old, pos)]
        self.rows[pk] = new
        if old is None:
            return [Change("+I", new, pos)]
        return [Change("-U", old, pos), Change("+U", new, pos)]

    def change(self, pos: tuple) -> list[Change]:
        rng = self.rng
        if self.reverts and rng.random() < 0.2:
            reverted = self.revert(pos)
            if reverted:
                return reverted
        roll = rng.random()
        if self.rows and self.updates and roll < 0.35:
            pk = rng.choice(sorted(self.rows))
            old = self.rows[pk]
            new = (pk, rng.randrange(self.keys) if rng.random() < 0.6 else old[1], rng.randrange(5))
            if new == old:
                return []
            self.rows[pk] = new
            return [Change("-U", old, pos), Change("+U", new, pos)]
        if self.rows and self.deletes and roll < 0.5:
            pk = rng.choice(sorted(self.rows))
            return [Change("-D", self.rows.pop(pk), pos)]
        pk = self.next_id
        self.next_id += 1
        row = (pk, rng.randrange(self.keys) if rng.random() > 0.05 else None, rng.randrange(5))
        self.rows[pk] = row
        return [Change("+I", row, pos)]


def workload(seed: int, batches: int = 12, per_batch: int = 8, keys: int = 4, b_append: bool = False,
             a_deletes: bool = True, reverts: bool = False) -> list[dict[str, list[Change]]]:
    """``batches`` dicts ``{"a": changes, "b": changes}``; positions increase globally."""
    rng = random.Random(seed)
    a = Side(rng, 1, keys, deletes=a_deletes, updates=True, reverts=reverts)
    b = Side(rng, 1000, keys, deletes=not b_append, updates=not b_append, reverts=reverts)
    seq = 0
    out = []
    for _ in range(batches):
        a.start_batch()
        b.start_batch()
        batch: dict[str, list[Change]] = {"a": [], "b": []}
        for _ in range(rng.randrange(per_batch + 1)):
            seq += 1
            name, side = ("a", a) if rng.random() < 0.5 else ("b", b)
            batch[name].extend(side.change((seq,)))
        out.append(batch)
    return out
