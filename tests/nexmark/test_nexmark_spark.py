"""Nexmark on the Spark job host against Flink 2.3: the generated events in three topics of
the broker, each query run by the real job host (``run_pipeline``, what ``tidemark run
--until-idle`` runs) on the test run's Spark session in several micro-batches, its sink
topic read back and compared with Flink's final table (``spark_host.py``).

``expected_status.SPARK_STATUS`` is this host's board: a query recorded "not planned: ...",
"not run: ..." or "fails: ..." is ``xfail(strict=True)`` and must stop with an error whose
message contains that text, so a query that starts to run, or stops elsewhere, fails until
the board says "equal".

``make test`` runs ``FAST`` (one Spark job each, on ``harness.data``'s small slice) and the
queries refused before a job starts; ``make conformance`` runs every query on the full data
(``TIDEMARK_CONFORMANCE=full``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import expected_status  # noqa: E402  (sibling modules, not a package)
import harness  # noqa: E402
import spark_host  # noqa: E402

from tidemark.engine.errors import TidemarkError  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.conformance]

DATA = harness.data(harness.FULL)
#: one query per kind of keyed stage the host chains: a join with a non-equi condition
#: into two aggregates (q4), ROW_NUMBER Top-N (q19), and a stateless projection with
#: string functions into a sink without a key (q22)
FAST = {"q4", "q8", "q19", "q22"}


def _params() -> list:
    params = []
    for q in harness.QUERY_NAMES:
        status = expected_status.SPARK_STATUS[q]
        if status.startswith("not compared: "):
            continue
        marks = []
        if status.startswith("differs: "):  # the job runs; its final table is not Flink's
            marks.append(pytest.mark.xfail(strict=True, raises=AssertionError, reason=status))
        elif status != "equal":
            marks.append(pytest.mark.xfail(strict=True, raises=TidemarkError, reason=status))
        # a refusal costs no job; a job that fails runs as long as one that does not
        if (status == "equal" and q not in FAST) or status.startswith(("fails: ", "differs: ")):
            marks.append(pytest.mark.slow)
        params.append(pytest.param(q, marks=marks, id=q))
    return params


@pytest.mark.parametrize("query", _params())
def test_query_on_spark(request: pytest.FixtureRequest, spark, kafka_bootstrap, tmp_path, query: str) -> None:
    expected = expected_status.SPARK_STATUS[query]
    try:
        final, batches = spark_host.run_spark(spark, kafka_bootstrap, query, harness.query_sql(query), DATA, tmp_path)
    except TidemarkError as e:
        prefix = expected.partition(": ")[2]
        assert expected != "equal" and prefix in str(e), (
            f"{query} stops on Spark: {e}; expected_status.py says {expected!r}")
        raise
    report = request.getfixturevalue("flink")[query]
    assert report["ok"], f"Flink failed on {query}: {report['error']}"
    assert batches >= 2, f"{query}: the job should read the topics in several micro-batches, it took {batches}"
    assert final == harness.canon(report["final"]), f"{query}: the sink's final table differs from Flink's"
