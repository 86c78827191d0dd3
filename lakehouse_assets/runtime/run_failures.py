"""Why a run failed, in one line: the error its first failed step's op raised (inside the error
Dagster wraps it in), or its resources' when they failed to start (a liveness lock the disk had no
room for), as Dagster recorded it: for the runner's console and the sensors' skip reasons."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import dagster as dg
from dagster_shared.error import SerializableErrorInfo

from lakehouse_assets.storage_space import StorageFullError, storage_failure

FAILURES = {dg.DagsterEventType.STEP_FAILURE, dg.DagsterEventType.RESOURCE_INIT_FAILURE}


def op_errors(events: Iterable[dg.DagsterEvent]) -> list[tuple[str, SerializableErrorInfo]]:
    """Each failed step of ``events`` (or ``resources`` when they failed to start) and its error."""
    errors = []
    for event in events:
        if event.event_type not in FAILURES:
            continue
        error = getattr(event.event_specific_data, "error", None)
        if error is None:
            continue
        while error.cls_name.startswith("Dagster") and error.cause is not None:  # Dagster's wrapping
            error = error.cause
        errors.append((event.step_key or "resources", error))
    return errors


def first_line(error: SerializableErrorInfo) -> str:
    """The first line of the error's own message (Dagster's starts with the error's qualified name)."""
    first = error.message.strip().partition("\n")[0]
    return first.partition(": ")[2] or first


def failure_line(events: Iterable[dg.DagsterEvent], written: Sequence[Path] = ()) -> str | None:
    """``<step>: <error class>: <first line>`` of the first failed step, or None when none failed;
    for a write a file system refused, the storage's line (``StorageFullError``) naming the one of
    ``written`` that was full when the error named no path."""
    for step, error in op_errors(events):
        if error.cls_name == StorageFullError.__name__:
            return f"{step}: {first_line(error)}"
        if full := storage_failure(error.to_string(), step, written):
            return str(full)
        return f"{step}: {error.cls_name}: {first_line(error)}"
    return None


def recorded_failure(instance: dg.DagsterInstance, run_id: str, written: Sequence[Path] = ()) -> str | None:
    """``failure_line`` of a run the instance recorded: one indexed read of its first failure."""
    connection = instance.get_records_for_run(run_id, of_type=FAILURES, limit=1)
    events = (record.event_log_entry.dagster_event for record in connection.records)
    return failure_line([event for event in events if event is not None], written)
