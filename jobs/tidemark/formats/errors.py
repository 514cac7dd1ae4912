"""The two ways a format can fail.

``DecodeError`` is about ONE record: the pipeline keeps running and the record goes to the
dead-letter topic with ``reason``. ``FormatError`` is about the table declaration (unknown
format, a Confluent format without a registry URL): the pipeline cannot start.
"""

from __future__ import annotations

from tidemark.engine.errors import PlanError


class DecodeError(Exception):
    """A record that cannot be turned into changes of its table. ``reason`` is the text
    that lands in the dead-letter record; ``kind`` is a short category for counters
    (``undecodable``, ``missing_pk``, ``wrong_type``, ``unknown_op``, ``bad_envelope``)."""

    def __init__(self, reason: str, kind: str = "bad_envelope"):
        super().__init__(reason)
        self.reason = reason
        self.kind = kind


class FormatError(PlanError):
    """A table's format options cannot be used (named table, format and option)."""
