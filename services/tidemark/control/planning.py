"""The one place the service asks the planner about SQL: the plan, or the planner's message.

Plans are cached by the SHA-256 of the SQL: a request plans its SQL once however many steps
look at the plan, and a service loading a large registry (every record's SQL is checked)
plans each distinct text once.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tidemark.engine.pipeline import Pipeline

log = logging.getLogger("tidemark.control.planning")


CACHE_SIZE = 1024
_cache: OrderedDict[bytes, Pipeline] = OrderedDict()
_cache_lock = threading.Lock()


class PlanRejected(ValueError):
    """The SQL does not plan; ``str()`` is the planner's own message, shown to the user."""

    def __init__(self, message: str, kind: str):
        super().__init__(message)
        self.kind = kind


def explain(sql: str) -> dict[str, Any]:
    """``compile_sql(sql).explain()`` -- the same dict ``tidemark explain --json`` prints."""
    pipeline = compile_pipeline(sql)
    try:
        return pipeline.explain()
    except Exception as err:
        log.exception("explain failed on a pipeline that planned")
        raise PlanRejected(f"the planner could not explain this SQL ({type(err).__name__}: {err}); "
                           "this is a Tidemark bug, please report it", "InternalPlannerError") from err


def compile_pipeline(sql: str) -> Pipeline:
    """``compile_sql(sql)``, with every failure turned into ``PlanRejected``; the plan is
    cached (a ``Pipeline`` is not modified after planning), failures are not."""
    digest = hashlib.sha256(sql.encode()).digest()
    with _cache_lock:
        if digest in _cache:
            _cache.move_to_end(digest)
            return _cache[digest]
    pipeline = _compile(sql)
    with _cache_lock:
        _cache[digest] = pipeline
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return pipeline


def _compile(sql: str) -> Pipeline:
    from tidemark.engine.errors import TidemarkError
    from tidemark.engine.pipeline import compile_sql
    from tidemark.kafka.config import check_tables
    from tidemark.spark.watermark import check_supported as check_event_time

    try:
        pipeline = compile_sql(sql)
        check_tables(pipeline.tables)  # 'properties.*' confluent-kafka refuses, naming the table
        check_event_time(pipeline)  # event time the Spark host cannot run yet (spark/watermark.py)
        return pipeline
    except TidemarkError as err:
        raise PlanRejected(str(err), type(err).__name__) from err
    except RecursionError as err:  # absurdly nested SQL from a client must not be a 500
        raise PlanRejected("the SQL is nested too deeply to plan", "SqlError") from err
    except Exception as err:
        # a planner bug must not turn a client's SQL into a 500 with a stack trace; the
        # traceback goes to the service log for the report
        log.exception("planner failed on submitted SQL")
        raise PlanRejected(f"the planner could not handle this SQL ({type(err).__name__}: {err}); "
                           "this is a Tidemark bug, please report it", "InternalPlannerError") from err
