"""Every stage satisfies the KeyedStage contract the hosts rely on, and its state pickles."""

from __future__ import annotations

import pickle

import pytest

from stage_harness import Harness, c
from tidemark.engine.stage import KeyedStage
from tidemark.engine.stages.aggregate import AggCall, GroupAggregate
from tidemark.engine.stages.join import Join
from tidemark.engine.stages.materializer import SinkMaterializer
from tidemark.engine.stages.normalize import Normalize

STAGES = {
    "normalize": (Normalize((0,), 2), [[c("+I", 1, 2, pos=1)]]),
    "aggregate": (GroupAggregate((0,), [AggCall("MAX", 1), AggCall("LAST_VALUE", 1)]), [[c("+I", 1, 2, pos=1)]]),
    "join": (Join("full", (0,), (0,), 2, 2), [[c("+I", 1, 2, pos=1)], [c("+I", 1, 3, pos=2)]]),
    "dedup": (SinkMaterializer("t", (0,), ("k",), (1,), "DEDUPLICATE"), [[c("+I", 1, 2, pos=1)]]),
    "nothing": (SinkMaterializer("t", (0,), ("k",), None, "NOTHING", ttl_ms=10), [[c("+I", 1, 2, pos=1)]]),
}


@pytest.mark.parametrize("name", list(STAGES))
def test_contract_and_pickled_state_round_trip(name):
    stage, batch = STAGES[name]
    assert isinstance(stage, KeyedStage)
    assert stage.n_inputs == len(batch)
    h = Harness(stage)
    first = h.run(*batch)
    assert first and h.state
    # the same stage object, pickled with its state, continues identically (Spark hosting)
    stage2 = pickle.loads(pickle.dumps(stage))
    h2 = Harness(stage2)
    h2.state = pickle.loads(pickle.dumps(h.state))
    retract = [[ch._replace(kind="-D", pos=(9,)) for ch in side] for side in batch]
    assert sorted(h2.run(*retract)) == sorted(h.run(*retract))
    assert h.state == {} and h2.state == {}
