"""Changing a registered pipeline (``PUT /v1/pipelines/{name}``): the request body, and the
check that the new SQL can take the old state over.

The check compares with what the pipeline's checkpoint records (``tidemark run`` writes it
on every start, so it is the plan the state was made with), or, for a checkpoint this
service cannot read (remote storage), with the plan of the SQL the registry holds: every
accepted change was compatible with the one before, so both answer alike. A pipeline that
never started has no state: any change is accepted. ``tidemark run`` checks again on start
whatever this service decided; it owns the checkpoint.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from tidemark.control import planning
from tidemark.control.models import MAX_SQL_CHARS, PipelineOptions
from tidemark.control.registry_log import PipelineRecord
from tidemark.engine.fingerprint import IncompatibleChange, check_compatible, fingerprint, read_record
from tidemark.engine.pipeline import Pipeline


class PipelineUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    sql: str = Field(min_length=1, max_length=MAX_SQL_CHARS, description="The new CREATE TABLE ...; INSERT INTO ...")
    options: PipelineOptions = Field(default_factory=PipelineOptions, description="Replace the job options")
    fresh_start: bool = Field(
        False, description="Drop the state: a new checkpoint, reprocessing from the sources' start position. "
                            "Needed for a change the old state cannot serve (otherwise 409 says why)")


def incompatibility(current: PipelineRecord, checkpoint: str, new: Pipeline) -> str | None:
    """Why ``new`` cannot keep ``current``'s state (kept in ``checkpoint``), or None."""
    old = read_record(checkpoint)
    if old is None and current.ever_started:
        try:
            old = fingerprint(planning.compile_pipeline(current.sql))
        except planning.PlanRejected as exc:  # planned when registered; this version refuses it
            return (f"pipeline '{current.name}': its registered SQL no longer plans ({exc}), so nothing tells "
                    "whether its state fits the new plan; send \"fresh_start\": true to start over")
    try:
        check_compatible(old, fingerprint(new), f"pipeline '{current.name}'")
    except IncompatibleChange as exc:
        return f"{exc}; send \"fresh_start\": true to start over from a new checkpoint"
    return None
