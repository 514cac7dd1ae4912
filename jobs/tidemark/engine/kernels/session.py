"""Session windows under the batch contract: per key, a record opens the window
``[t, t + gap)`` and merges with every open session of its key that window touches, as
Flink's merging window operator does; a session fires when the watermark passes its end.

Late records: a record whose (merged) session had already ended before its batch's
watermark is dropped and counted in ``late_records_dropped``. Which sessions a record merges
with depends on the records before it, so a key's records are taken in source-position
order (the order Flink reads them in).

State is typed: one row per open session (its group columns, ``$start``/``$end`` in epoch
ms, the partial aggregates, the greatest source position), read into Python per batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from tidemark.engine.batch import ChangeBatch
from tidemark.engine.changelog import INSERT, Change
from tidemark.engine.errors import TidemarkError
from tidemark.engine.event_time import epoch_ms, from_epoch_ms, watermark_of
from tidemark.engine.stage import BatchContext
from tidemark.engine.stages.aggregate import SumAcc

_START, _END, _POS = "$start", "$end", "$pos"


class SessionKernel:
    """``process_batch`` and the typed state protocol for a ``WindowAggregate`` over session
    windows; state: key -> open sessions, each ``{start, end, acc, pos}``."""

    state_kind = "session-aggregate"
    state_version = 1

    def __init__(self, stage) -> None:  # noqa: ANN001  (WindowAggregate; imports this module)
        self.stage = stage
        self.name = stage.name
        self.n_inputs = 1
        self._key = [i for i in stage.group_by if i not in (stage.window_start_index, stage.window_end_index)]

    # ------------------------------------------------------------------ state protocol

    def empty_state(self) -> dict[tuple, list[dict]]:
        return {}

    def state_to_table(self, state: dict[tuple, list[dict]]) -> pa.Table | None:
        rows = []
        for key, sessions in state.items():
            for session in sessions:
                row = {f"g{j}": v for j, v in enumerate(key)}
                row.update({_START: session["start"], _END: session["end"], _POS: list(session["pos"])})
                for i, (call, acc) in enumerate(zip(self.stage.calls, session["acc"])):
                    if call.func in ("SUM", "AVG"):
                        row[f"a{i}"], row[f"a{i}_n"] = acc
                    else:
                        row[f"a{i}"] = acc
                rows.append(row)
        return pa.Table.from_pylist(rows) if rows else None

    def state_from_table(self, table: pa.Table) -> dict[tuple, list[dict]]:
        state: dict[tuple, list[dict]] = {}
        for row in table.to_pylist():
            acc = [(row[f"a{i}"], row[f"a{i}_n"]) if call.func in ("SUM", "AVG") else row[f"a{i}"]
                   for i, call in enumerate(self.stage.calls)]
            key = tuple(row[f"g{j}"] for j in range(len(self._key)))
            state.setdefault(key, []).append(
                {"start": row[_START], "end": row[_END], "acc": acc, "pos": tuple(row[_POS])})
        return state

    # ------------------------------------------------------------------ the batch

    def process_batch(
        self, inputs: Sequence[ChangeBatch], state: dict[tuple, list[dict]], ctx: BatchContext
    ) -> tuple[dict[tuple, list[dict]], ChangeBatch]:
        stage = self.stage
        before = watermark_of(ctx.previous_watermarks, stage.sources)
        after = watermark_of(ctx.watermarks, stage.sources)
        for c in sorted(inputs[0].changes(), key=lambda c: c.pos):
            if not c.is_add:
                raise TidemarkError(f"stage '{stage.name}': a window aggregate takes inserts only, and got a retraction")
            key = tuple(c.row[i] for i in self._key)
            start, end = epoch_ms(c.row[stage.window_start_index]), epoch_ms(c.row[stage.window_end_index])
            sessions = state.get(key, [])
            touching = [s for s in sessions if start <= s["end"] and end >= s["start"]]
            merged = {"start": min([start, *(s["start"] for s in touching)]),
                      "end": max([end, *(s["end"] for s in touching)]),
                      "acc": self._acc(c.row), "pos": c.pos}
            if before is not None and merged["end"] - 1 <= before:
                ctx.metrics["late_records_dropped"] += 1
                continue
            for s in touching:
                merged["acc"] = [_merge(call.func, a, b) for call, a, b in zip(stage.calls, merged["acc"], s["acc"])]
                merged["pos"] = max(merged["pos"], s["pos"])
            state[key] = [s for s in sessions if s not in touching] + [merged]
        out: list[Change] = []
        if after is not None:
            for key in sorted(state, key=_sort_key):
                fired = [s for s in state[key] if s["end"] - 1 <= after]
                if not fired:
                    continue
                state[key] = [s for s in state[key] if s["end"] - 1 > after]
                if not state[key]:
                    del state[key]
                out += [self._row(key, s) for s in sorted(fired, key=lambda s: s["start"])]
        return state, ChangeBatch(changes=out)

    def _acc(self, row: tuple) -> list[Any]:
        accs: list[Any] = []
        for call in self.stage.calls:
            v = row[call.arg] if call.arg is not None else None
            if call.func == "COUNT_STAR":
                accs.append(1)
            elif call.func == "COUNT":
                accs.append(int(v is not None))
            elif call.func in ("SUM", "AVG"):
                accs.append((v if v is not None else 0, int(v is not None)))
            else:
                accs.append(v)
        return accs

    def _row(self, key: tuple, session: dict) -> Change:
        stage = self.stage
        values = iter(key)
        row: list[Any] = []
        for i in stage.group_by:
            if i == stage.window_start_index:
                row.append(from_epoch_ms(session["start"]))
            elif i == stage.window_end_index:
                row.append(from_epoch_ms(session["end"]))
            else:
                row.append(next(values))
        for call, acc in zip(stage.calls, session["acc"]):
            if call.func in ("SUM", "AVG"):
                total = SumAcc()
                total.total, total.n = acc
                row.append(total.sum() if call.func == "SUM" else total.avg())
            else:
                row.append(acc)
        return Change(INSERT, tuple(row), session["pos"])


def _merge(func: str, a: Any, b: Any) -> Any:
    if func in ("COUNT", "COUNT_STAR"):
        return a + b
    if func in ("SUM", "AVG"):
        return (a[0] + b[0], a[1] + b[1])
    if a is None or b is None:
        return b if a is None else a
    return max(a, b) if func == "MAX" else min(a, b)


def _sort_key(key: tuple) -> tuple:
    return tuple((v is not None, v) for v in key)
