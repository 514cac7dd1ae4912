"""The one place the service asks the planner about SQL: the plan, or the planner's message."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tidemark.engine.pipeline import Pipeline

log = logging.getLogger("tidemark.control.planning")


class PlanRejected(Exception):
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
    """``compile_sql(sql)``, with every failure turned into ``PlanRejected``."""
    from tidemark.engine.errors import TidemarkError
    from tidemark.engine.pipeline import compile_sql
    from tidemark.kafka.config import check_tables

    try:
        pipeline = compile_sql(sql)
        check_tables(pipeline.tables)  # 'properties.*' confluent-kafka refuses, naming the table
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
