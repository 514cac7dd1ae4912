"""Kafka client settings from the operator and from the SQL, for every client Tidemark makes.

Two sources, both in librdkafka's names (the names Flink's ``properties.*`` use too, e.g.
``security.protocol``, ``sasl.mechanism``, ``ssl.ca.location``):

- ``--kafka-config FILE`` (``key=value`` lines, ``#`` comments) for ``tidemark run``,
  ``tidemark control`` and ``tidemark index``. The commands put the file's path in
  ``TIDEMARK_KAFKA_CONFIG`` so that every client they create, and every process they start
  (jobs, index service, Spark's Python workers), reads the same file.
- ``'properties.<key>' = '<value>'`` table options, for that table's consumer or producer only.

``client_config`` merges them over the bootstrap servers; the table's settings win over the
file's. Validating is left to confluent-kafka: ``check`` builds a client and turns its
complaint into an error naming the file or the table.
"""

from __future__ import annotations

import configparser
import os
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from confluent_kafka import KafkaException, Producer

from tidemark.engine.errors import TidemarkError

CONFIG_ENV = "TIDEMARK_KAFKA_CONFIG"
PROPERTIES_PREFIX = "properties."
#: a table cannot point its client elsewhere than the pipeline's brokers
_NOT_PER_TABLE = frozenset({"bootstrap.servers"})


class KafkaConfigError(TidemarkError):
    """A client setting confluent-kafka (or the file's syntax) refuses."""

    exit_status = 2


@lru_cache(maxsize=8)
def read_config_file(path: str) -> dict[str, str]:
    """The ``key=value`` settings of ``path`` (configparser, one implicit section)."""
    parser = configparser.ConfigParser(delimiters=("=",), comment_prefixes=("#",), interpolation=None,
                                       strict=True)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    try:
        with open(path, encoding="utf-8") as f:
            parser.read_string("[kafka]\n" + f.read(), source=path)
    except OSError as exc:
        raise KafkaConfigError(f"--kafka-config {path}: cannot read: {exc.strerror or exc}") from None
    except configparser.ParsingError as exc:
        lineno, line = exc.errors[0]  # line: repr of the text; lineno counts the section header added above
        raise KafkaConfigError(f"--kafka-config {path}:{lineno - 1}: expected key=value, got {line[:80]}") from None
    except configparser.DuplicateOptionError as exc:
        raise KafkaConfigError(f"--kafka-config {path}:{(exc.lineno or 1) - 1}: '{exc.option}' set twice") from None
    except UnicodeDecodeError as exc:
        raise KafkaConfigError(f"--kafka-config {path}: not UTF-8 text ({exc.reason})") from None
    settings = dict(parser["kafka"])
    check(settings, f"--kafka-config {path}")
    return settings


def file_settings() -> dict[str, str]:
    """The settings of the file named by ``TIDEMARK_KAFKA_CONFIG``; none when unset."""
    path = os.environ.get(CONFIG_ENV)
    return dict(read_config_file(path)) if path else {}


def use_config_file(path: str | None) -> None:
    """Make ``path`` the settings of this process and of the processes it starts (checked
    first: a bad file is an error now, naming it, not a failure in some client later)."""
    if path is None:
        return
    path = os.path.abspath(path)
    read_config_file(path)
    os.environ[CONFIG_ENV] = path


def table_properties(options: Mapping[str, str]) -> dict[str, str]:
    """A table's ``properties.<key>`` options as client settings."""
    return {k[len(PROPERTIES_PREFIX):]: v for k, v in options.items()
            if k.startswith(PROPERTIES_PREFIX) and k[len(PROPERTIES_PREFIX):] not in _NOT_PER_TABLE}


def client_config(bootstrap: str, file: Mapping[str, str] | None = None,
                  table: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The settings of one client: the bootstrap servers, the file's settings (default: the
    ``TIDEMARK_KAFKA_CONFIG`` file), then the table's ``properties.*``. Callers add the
    settings their own correctness depends on (isolation level, transactional id) last."""
    return {"bootstrap.servers": bootstrap, **(file_settings() if file is None else file), **(table or {})}


def check(settings: Mapping[str, Any], where: str) -> None:
    """Raise ``KafkaConfigError`` naming ``where`` when confluent-kafka refuses ``settings``."""
    try:
        Producer({**settings, "log_level": 0})
    except KafkaException as exc:
        raise KafkaConfigError(f"{where}: {exc.args[0].str()}") from None


def check_tables(tables: Mapping[str, Any]) -> None:
    """Every table's ``properties.*`` over the file's settings, as its client will get them
    (``tables``: name -> TableDef)."""
    for name, table in tables.items():
        props = table_properties(table.options)
        if props:
            check({**file_settings(), **props}, f"table '{name}': 'properties.*' options")
