"""docs/formats.md tells producers what to write; this runs every producer it shows
(a ```python block right after ``<!-- producer FORMAT -->``) against the embedded broker
and checks that Tidemark's decoder, for the page's ``customers`` table in that FORMAT,
reads exactly the changes the page lists after it (the block after ``<!-- changes -->``),
one ``KIND {row as JSON}`` per line. The snippets name ``localhost:9092`` as a reader's
broker would; the test points them at its own."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import pytest

from tidemark.engine.sql import parse_script
from tidemark.formats import decoder_for
from tidemark.formats.rows import RowCodec
from tidemark.kafka.admin import delete_topics, ensure_topics
from tidemark.kafka.read import read_topic

pytestmark = pytest.mark.integration
DOC = Path(__file__).resolve().parents[2] / "docs" / "formats.md"
EXAMPLE = re.compile(r"<!-- producer ([a-z-]+) -->\n```python\n(.*?)```.*?<!-- changes -->\n```\n(.*?)```", re.S)
TABLE = ("CREATE TABLE customers (id BIGINT, name STRING, balance DECIMAL(10, 2), PRIMARY KEY (id) NOT ENFORCED) "
         "WITH ('topic' = 'customers', 'format' = '{fmt}');"
         "CREATE TABLE sink (id BIGINT, PRIMARY KEY (id) NOT ENFORCED) WITH ('format' = 'upsert-json');"
         "INSERT INTO sink SELECT id FROM customers;")


def examples() -> list[tuple[str, str, list[str]]]:
    found = [(fmt, code, changes.strip().splitlines()) for fmt, code, changes in EXAMPLE.findall(DOC.read_text())]
    assert len(found) >= 5, "docs/formats.md lost its producer examples"
    return found


@pytest.fixture(scope="module")
def broker(kafka_bootstrap: str) -> str:
    """The session's broker (tests/conftest.py)."""
    return kafka_bootstrap


@pytest.mark.parametrize(("fmt", "code", "expected"), examples(), ids=[e[0] for e in examples()])
def test_the_producer_writes_what_the_page_says_tidemark_reads(broker: str, fmt: str, code: str,
                                                               expected: list[str]) -> None:
    topic = f"customers-{uuid.uuid4().hex[:8]}"
    # one partition, as the page's changes are listed in one order (keyless records would
    # otherwise spread over an auto-created topic's partitions and read back in any order)
    ensure_topics(broker, {topic: 1})
    exec(compile(code.replace('"localhost:9092"', repr(broker)).replace('"customers"', repr(topic)),  # noqa: S102
                 f"{DOC.name}:{fmt}", "exec"), {})
    table = parse_script(TABLE.format(fmt=fmt)).tables["customers"]
    decoder, rows = decoder_for(table), RowCodec(table)
    got = [f"{c.kind} {json.dumps(rows.to_json(c.row))}"
           for r in read_topic(broker, topic) for c in decoder.decode(r.key, r.value, topic=topic)]
    delete_topics(broker, [topic])
    assert got == expected
