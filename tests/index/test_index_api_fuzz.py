"""Property-based fuzzing of the index service's whole API from its own /openapi.json
(schemathesis), against a real ``tidemark index`` process with a loaded table.

Every generated request -- valid (positive) and schema-violating (negative) bodies, odd path
parameters -- sent with the token and without it must get a documented status code with a
body that matches the documented schema, and never a 5xx. Half the requests name the loaded
table (``t``, whose index columns have several types), so key coercion and fence waits are
reached, not only the 404 of an unknown table. The example count is bounded
(``TIDEMARK_FUZZ_EXAMPLES``) so this stays well under a minute.
"""

from __future__ import annotations

import os

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from index_support import PROCESS_TOKEN, produce
from schemathesis import GenerationMode

pytestmark = pytest.mark.integration

MAX_EXAMPLES = int(os.environ.get("TIDEMARK_FUZZ_EXAMPLES", "150"))

TABLE = """CREATE TABLE t (id BIGINT, name STRING, price DECIMAL(10, 2), at TIMESTAMP(3), ok BOOLEAN, d DATE,
  PRIMARY KEY (id) NOT ENFORCED) WITH ('topic' = '{topic}', 'format' = 'upsert-json',
  'index.by_name.columns' = 'name', 'index.by_price_at.columns' = 'price,at', 'index.by_ok_d.columns' = 'ok,d')"""

# A schema-violating request may also be refused for its size (413) or its missing token (401)
# before anything looks at the schema; that is a rejection too.
CONFIG = schemathesis.Config.from_dict({"checks": {"negative_data_rejection": {"expected-statuses": [
    "400", "401", "404", "405", "409", "413", "415", "422", "429", "5xx"]}}})


@pytest.mark.parametrize("with_token", [True, False], ids=["token", "no-token"])
def test_no_generated_request_gets_a_server_error(index_process, kafka_bootstrap, make_topic, with_token):
    topic = make_topic("t")
    produce(kafka_bootstrap, topic, [({"id": 1}, {"id": 1, "name": "a", "price": "1.50", "at": "2026-01-01 00:00:00",
                                                  "ok": True, "d": "2026-01-01"})])
    proc = index_process("--max-wait-ms", "200", "--max-waiters", "2")
    assert proc.client.post("/v1/tables", json={"ddl": TABLE.format(topic=topic)}).status_code == 201
    proc.wait_ready()
    schema = schemathesis.openapi.from_url(proc.url + "/openapi.json", config=CONFIG)
    cases = st.one_of(schema.as_strategy(GenerationMode.POSITIVE), schema.as_strategy(GenerationMode.NEGATIVE))
    headers = {"Authorization": f"Bearer {PROCESS_TOKEN}"} if with_token else {}
    seen: set[str] = set()

    @given(case=cases, on_table=st.booleans())
    @settings(max_examples=MAX_EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    def check(case, on_table):
        seen.add(case.operation.label)
        if on_table and isinstance(case.body, dict) and "table" in case.body:
            case.body["table"] = "t"
        if on_table and "name" in (case.path_parameters or {}):
            case.path_parameters["name"] = "t"
        # positive_data_acceptance is off: schema-valid keys of the wrong type for the index
        # columns are a 400 by design (the table, not the JSON schema, decides the types)
        case.call_and_validate(headers=headers, excluded_checks=[schemathesis.checks.positive_data_acceptance])

    check()
    assert len(seen) >= 6, seen  # the examples reached (nearly) every operation
    assert "Traceback" not in proc.log.read_text()
