"""Property-based fuzzing of the whole API from its own /openapi.json (schemathesis).

Every generated request -- valid (positive) and schema-violating (negative) bodies, odd path
parameters -- sent with the token must get a documented status code with a body that matches
the documented schema, and never a 5xx. The example count is bounded
(``TIDEMARK_FUZZ_EXAMPLES``) so this runs in ``make test`` in well under a minute.

The strategy API (``schema.as_strategy()`` under hypothesis' ``@given``) is used rather
than ``schemathesis.pytest.from_fixture``, whose lazy loader does not work on pytest 9.
"""

from __future__ import annotations

import os

import pytest
import schemathesis
from control_support import TOKEN
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

pytestmark = pytest.mark.integration

MAX_EXAMPLES = int(os.environ.get("TIDEMARK_FUZZ_EXAMPLES", "150"))


# A schema-violating request may also be refused for its size (413, the body cap) before
# anything looks at the schema; that is a rejection too.
CONFIG = schemathesis.Config.from_dict({"checks": {"negative_data_rejection": {"expected-statuses": [
    "400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429", "5xx"]}}})


def test_no_generated_request_gets_a_server_error(service):
    schema = schemathesis.openapi.from_url(service.url + "/openapi.json", config=CONFIG)
    cases = st.one_of(schema.as_strategy(GenerationMode.POSITIVE), schema.as_strategy(GenerationMode.NEGATIVE))
    seen: set[str] = set()

    @given(case=cases)
    @settings(max_examples=MAX_EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    def check(case):
        seen.add(case.operation.label)
        # positive_data_acceptance is off: schema-valid SQL that does not plan is a 422 by
        # design (the planner, not the JSON schema, decides what SQL means)
        case.call_and_validate(headers={"Authorization": f"Bearer {TOKEN}"},
                               excluded_checks=[schemathesis.checks.positive_data_acceptance])

    check()
    assert len(seen) >= 8, seen  # the examples reached (nearly) every operation
