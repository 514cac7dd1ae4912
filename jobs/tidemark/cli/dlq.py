"""``tidemark dlq PIPELINE``: print a pipeline's dead letters, the source records it could
not decode, each with why and where it came from (``topic/partition/offset``), so a user
can find and fix the producer without writing a consumer of their own.

The topic is ``<pipeline>.dlq`` (``tidemark.formats.dead_letter``); it is written in
transactions, so it is read ``read_committed`` (``tidemark.kafka.read.records``).
A dead letter is JSON or Avro with one schema (``proto/dead_letter.avsc``); which one is
told by its first byte, since a JSON letter starts with ``{`` and an Avro one with the
length of its pipeline name (a zig-zag varint, never ``{``).
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Annotated

import typer

from tidemark.formats import dead_letter
from tidemark.formats.dead_letter import DeadLetter

PREVIEW_CHARS = 200


def _encoding_of(value: bytes) -> str:
    return "json" if value[:1] == b"{" else "avro"


def letters(bootstrap: str, topic: str, *, follow: bool, timeout_s: float = 60.0) -> Iterator[DeadLetter]:
    """The dead letters of ``topic`` from its beginning, partition by partition in offset
    order; at the end of every partition: return, or with ``follow`` wait for more until
    the caller stops iterating."""
    from tidemark.kafka.read import records

    for record in records(bootstrap, topic, follow=follow, timeout_s=timeout_s):
        if record.value is not None:
            yield dead_letter.decode(record.value, _encoding_of(record.value))


def _preview(data: bytes | None) -> str:
    """The bad record as a person can read it: its text when it is UTF-8, else base64."""
    if data is None:
        return "(null)"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = "base64:" + base64.b64encode(data).decode()
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 3] + "..."


def as_text(letter: DeadLetter) -> str:
    return (
        f"{letter.coordinate}  table {letter.table} ({letter.format}), batch {letter.batch_id}\n"
        f"  {letter.error_kind}: {letter.reason}\n"
        f"  key:   {_preview(letter.key)}\n"
        f"  value: {_preview(letter.value)}"
    )


def as_json(letter: DeadLetter) -> str:
    """The dead letter as its JSON encoding writes it (bytes as base64), one line."""
    return dead_letter.encode(letter, "json")[1].decode()


def dlq(
    pipeline: Annotated[str, typer.Argument(help="Pipeline name (reads NAME.dlq), or a dead-letter topic ending in .dlq.")],
    bootstrap_servers: Annotated[
        str | None, typer.Option("--bootstrap-servers", help="Kafka brokers. Default: $KAFKA_BOOTSTRAP_SERVERS.")
    ] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", metavar="", help="Keep printing dead letters as they arrive (Ctrl-C stops).")
    ] = False,
    as_json_lines: Annotated[
        bool, typer.Option("--json", metavar="", help="One JSON object per dead letter (key and value base64).")
    ] = False,
) -> None:
    """Print a pipeline's dead letters: why each record was refused and where it came from."""
    from confluent_kafka import KafkaException

    from tidemark.kafka.admin import KafkaAdminError
    from tidemark.kafka.broker import broker_answers, configured_bootstrap

    bootstrap = configured_bootstrap(bootstrap_servers)
    if bootstrap is None:
        _fail("no --bootstrap-servers and no KAFKA_BOOTSTRAP_SERVERS: say which Kafka the pipeline writes to")
    if not broker_answers(bootstrap, timeout_s=10.0):
        _fail(f"no Kafka broker answers at {bootstrap} (check --bootstrap-servers)")
    topic = pipeline if pipeline.endswith(".dlq") else dead_letter.dlq_topic(pipeline)
    count = 0
    try:
        for letter in letters(bootstrap, topic, follow=follow):
            typer.echo(as_json(letter) if as_json_lines else as_text(letter))
            count += 1
    except KafkaAdminError:
        _fail(f"topic '{topic}' does not exist on {bootstrap}: has the pipeline run against this broker?")
    except (KafkaException, RuntimeError, TimeoutError) as err:
        _fail(f"reading '{topic}' on {bootstrap}: {err}")
    except KeyboardInterrupt:
        pass
    if not as_json_lines:
        typer.echo(f"{count} dead letter(s) in {topic}", err=True)


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)
