"""Every table option (``WITH (...)``) and pipeline option (``SET``) Tidemark reads, with
its default and meaning: the one list that planning checks against and docs/sql.md
documents (a unit test holds the two together).

Planning is strict: an option that is not here, a format or connector the runtime does
not implement, or a value outside an option's choices is refused by name, naming its
table and the nearest known name, because an option that is accepted and then not
honoured (a misspelled ``'fromat'`` silently made an append-only table) gives an answer
that looks right and is not.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass

from tidemark.engine.errors import PlanError
from tidemark.engine.stages.merge import options as merge


@dataclass(frozen=True)
class Option:
    key: str
    default: str | None  # None: no default (unset means "not used")
    meaning: str
    choices: tuple[str, ...] = ()


CONNECTORS = ("kafka", "upsert-kafka")
#: formats the Kafka source decodes, by changelog mode (``tidemark.formats.codecs``)
APPEND_FORMATS = ("json", "avro", "avro-confluent")
RETRACT_FORMATS = (
    "debezium-json", "debezium-avro", "debezium-avro-confluent", "changelog-json", "changelog-avro",
    "changelog-avro-confluent",
)  # fmt: skip
UPSERT_FORMATS = ("upsert-json", "upsert-avro", "upsert-avro-confluent")
FORMATS = APPEND_FORMATS + RETRACT_FORMATS + UPSERT_FORMATS
#: Flink formats a user may reach for that Tidemark does not implement (refused by name)
FLINK_ONLY_FORMATS = ("canal-json", "maxwell-json", "ogg-json", "csv", "raw", "protobuf", "parquet", "orc")
#: the schema registry URL of Avro formats, under the names Flink and Confluent use
REGISTRY_OPTIONS = (
    "avro-confluent.url",
    "value.avro-confluent.url",
    "avro-confluent.schema-registry.url",
    "schema-registry.url",
)
STARTUP_MODES = ("earliest-offset", "latest-offset", "timestamp")
#: Flink startup modes Tidemark refuses (it keeps no consumer group offsets of its own)
UNSUPPORTED_STARTUP_MODES = ("group-offsets", "specific-offsets")
#: Flink's ``scan.bounded.mode``: ``latest-offset`` stops a source at the offsets that were
#: latest when the pipeline started, and its watermark then becomes the end of input
BOUNDED_MODES = ("unbounded", "latest-offset")
#: Flink bounded modes Tidemark refuses
UNSUPPORTED_BOUNDED_MODES = ("group-offsets", "timestamp", "specific-offsets")

TABLE_OPTIONS: tuple[Option, ...] = (
    Option("connector", "kafka", "where the table lives: a Kafka topic ('upsert-kafka' implies an upsert format)",
           CONNECTORS),
    Option("topic", None, "the Kafka topic (default: the table's name)"),
    Option("format", "json", "how records encode changes (append, retracting or upsert)", FORMATS),
    Option("value.format", "json", "Flink's name for 'format' (with 'upsert-kafka': the value encoding)", FORMATS),
    Option("key.format", None, "with 'upsert-kafka': the key encoding, the same as the value's"),
    Option("json.fail-on-missing-field", "false", "a JSON record missing a column is a bad record, not NULL",
           ("true", "false")),
    *(Option(key, None, "schema registry URL of an Avro format (Confluent wire format)") for key in REGISTRY_OPTIONS),
    Option("scan.startup.mode", "earliest-offset", "where a new pipeline starts reading a source topic",
           STARTUP_MODES),
    Option("scan.startup.timestamp-millis", None,
           "with 'scan.startup.mode' = 'timestamp': the first record read is the first at or after it"),
    Option("scan.bounded.mode", "unbounded",
           "where a source ends: never, or at the offsets latest when the pipeline started (then every "
           "event-time window still open fires)", BOUNDED_MODES),
)
#: option families: (prefix, suffix) -> meaning; the middle part is free
TABLE_OPTION_PATTERNS: dict[tuple[str, str], str] = {
    ("properties.", ""): "a Kafka client setting for this table, passed through (SASL/SSL and the like)",
    ("index.", ".columns"): "a delta-join index on these columns (besides the primary key)",
}

PIPELINE_OPTIONS: tuple[Option, ...] = (
    Option("table.exec.state.ttl", "0", "how long the sink materializer keeps an idle key's state (0: forever)"),
    Option("table.exec.sink.upserts.compaction-mode", "CHECKPOINT",
           "when the materializer compacts: every micro-batch (CHECKPOINT) or on watermarks", ("CHECKPOINT", "WATERMARK")),
    Option("table.optimizer.delta-join.strategy", "AUTO", "plan joins as delta joins when they qualify",
           ("AUTO", "FORCE", "NONE")),
    Option("table.exec.delta-join.consistency", "eventual", "exact (strong) or eventually consistent delta joins",
           ("strong", "eventual")),
    Option("table.exec.delta-join.cache-enabled", "true", "cache index lookups of delta joins", ("true", "false")),
    Option("table.exec.delta-join.left.cache-size", "10000", "join keys cached for the left input's lookups"),
    Option("table.exec.delta-join.right.cache-size", "10000", "join keys cached for the right input's lookups"),
)
#: other spellings of pipeline options that are accepted
PIPELINE_ALIASES = {
    "table.exec.delta-join.cache-enable": "table.exec.delta-join.cache-enabled",
    "table.exec.delta-join.left-cache-size": "table.exec.delta-join.left.cache-size",
    "table.exec.delta-join.right-cache-size": "table.exec.delta-join.right.cache-size",
}

_TABLE_KEYS = {o.key: o for o in TABLE_OPTIONS}
_PIPELINE_KEYS = {o.key: o for o in PIPELINE_OPTIONS}


def nearest(word: str, known: Iterable[str]) -> str:
    """' (did you mean 'x'?)' for a likely typo, else ''."""
    match = difflib.get_close_matches(word.lower(), list(known), n=1, cutoff=0.75)
    return f" (did you mean '{match[0]}'?)" if match else ""


def check_table_option(table: str, key: str, value: str) -> str | None:
    """Why a table option is refused (None: accepted)."""
    if any(key.startswith(p) and key.endswith(s) and len(key) > len(p) + len(s) for p, s in TABLE_OPTION_PATTERNS):
        if key == "properties.bootstrap.servers":
            return (
                f"table '{table}': 'properties.bootstrap.servers' is not read from a table: every table of a "
                "pipeline uses the broker given to 'tidemark run --bootstrap-servers' or the control service"
            )
        return None
    option = _TABLE_KEYS.get(key)
    if option is None:
        if merge.is_merge_option(key):
            return None  # merge options are checked by their own module, on the sink
        try:
            merge.routing_options(table, {key: value})  # names the merge option a typo meant
        except PlanError as e:
            return str(e)
        return f"table '{table}': unknown option '{key}'{nearest(key, [*_TABLE_KEYS, *merge.GENERAL_KEYS])}"
    if option.key in ("format", "value.format"):
        return format_problem(table, value)
    return _check_value(f"table '{table}': option '{key}'", option, value)


def format_problem(table: str, fmt: str) -> str | None:
    """Why a table's format is refused (None: the runtime implements it)."""
    if fmt.lower() in FORMATS:
        return None
    why = ": a Flink format Tidemark does not implement" if fmt.lower() in FLINK_ONLY_FORMATS else nearest(fmt, FORMATS)
    return f"table '{table}': unknown format '{fmt}'{why} (known: {', '.join(FORMATS)})"


def _check_value(what: str, option: Option, value: str) -> str | None:
    if option.key == "scan.startup.mode" and value.lower() in UNSUPPORTED_STARTUP_MODES:
        return (
            f"{what}: '{value}' is not supported: Tidemark keeps its offsets in its checkpoint, not in a "
            f"consumer group (modes: {', '.join(STARTUP_MODES)})"
        )
    if option.key == "scan.bounded.mode" and value.lower() in UNSUPPORTED_BOUNDED_MODES:
        return (
            f"{what}: '{value}' is not supported: a source ends only at the offsets latest when the "
            f"pipeline started (modes: {', '.join(BOUNDED_MODES)})"
        )
    choices = option.choices
    if choices and value.lower() not in (c.lower() for c in choices):
        return f"{what}: unknown value '{value}'{nearest(value, choices)} (expected one of {', '.join(choices)})"
    return None


def check_pipeline_option(key: str) -> str | None:
    """Why a ``SET`` key is refused (None: accepted). Values are checked where they are
    read (``tidemark.engine.delta_plan``, the planner)."""
    if PIPELINE_ALIASES.get(key, key) in _PIPELINE_KEYS:
        return None
    return f"SET '{key}': unknown pipeline option{nearest(key, _PIPELINE_KEYS)} (known: {', '.join(_PIPELINE_KEYS)})"


def check_table(table: str, options: dict[str, str]) -> str | None:
    """Why a table's options do not fit together (None: they do)."""
    connector = options.get("connector", "kafka").lower()
    fmt = options.get("format") or options.get("value.format")
    if connector == "upsert-kafka" and fmt is not None and fmt.lower() not in APPEND_FORMATS + UPSERT_FORMATS:
        return (
            f"table '{table}': the 'upsert-kafka' connector writes upserts, not format '{fmt}' "
            f"(use 'value.format' = one of {', '.join(APPEND_FORMATS)})"
        )
    key_format = options.get("key.format")
    if key_format is not None:
        value_encoding = _encoding((fmt or "json").lower())
        if key_format.lower() != value_encoding:
            return (
                f"table '{table}': 'key.format' = '{key_format}' differs from the value's encoding "
                f"'{value_encoding}' (Tidemark encodes key and value alike)"
            )
    mode = options.get("scan.startup.mode", "earliest-offset").lower()
    millis = options.get("scan.startup.timestamp-millis")
    if mode == "timestamp" and (millis is None or not millis.strip().isdigit()):
        return (
            f"table '{table}': 'scan.startup.mode' = 'timestamp' needs 'scan.startup.timestamp-millis' = "
            f"milliseconds since the epoch, got {millis!r}"
        )
    if mode != "timestamp" and millis is not None:
        return f"table '{table}': 'scan.startup.timestamp-millis' is read only with 'scan.startup.mode' = 'timestamp'"
    return None


def _encoding(fmt: str) -> str:
    """``upsert-avro-confluent`` -> ``avro-confluent``: the format without its envelope."""
    for envelope in ("debezium-", "changelog-", "upsert-"):
        if fmt.startswith(envelope):
            return fmt[len(envelope) :]
    return fmt


#: options only a source reads, refused on the sink (they would be ignored there)
SOURCE_ONLY = ("scan.startup.mode", "scan.startup.timestamp-millis", "scan.bounded.mode")


def misplaced(table: str, options: dict[str, str], role: str) -> str | None:
    """Why an option does not apply to a table in its ``role`` (``source`` or ``sink``):
    merge options configure the sink, startup options a source."""
    if role == "sink":
        wrong = [k for k in options if k in SOURCE_ONLY]
        where = "read by a source, and table '{t}' is the sink"
    else:
        wrong = [k for k in options if merge.is_merge_option(k)]
        where = "merge options of the sink, and table '{t}' is read"
    if not wrong:
        return None
    return f"table '{table}': option(s) {', '.join(repr(k) for k in wrong)} are {where.format(t=table)}"
