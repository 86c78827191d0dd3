"""Event-time completeness: the watermark each commit records, late events, completed days.

A stream's watermark is the largest event time it has committed minus ``allowed_lateness``, and
never moves back. A day (UTC) is complete once the watermark reaches the next midnight; events
committed later for a complete day are late: they are committed like any other and counted.
A table's watermark is the lowest of its streams'.
"""

from __future__ import annotations

from datetime import date, datetime, time, timedelta, timezone

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from lakehouse_assets.batches.staged_format import DELETE, OPERATION_COLUMN
from lakehouse_assets.commit.recovery import CommitHistory
from lakehouse_assets.config.spec import StreamSpec

MAX_DAYS_PER_COMMIT = 366
"""At most this many days are reported complete at once (a watermark may jump years)."""


def _parse(value: str) -> datetime:
    """An ISO 8601 instant, UTC when it carries no offset."""
    parsed = datetime.fromisoformat(value)
    return parsed.replace(tzinfo=timezone.utc) if parsed.tzinfo is None else parsed.astimezone(timezone.utc)


def _format(value: datetime) -> str:
    return value.isoformat(timespec="microseconds")


def next_watermark(previous: str | None, max_event_time: str | None, allowed_lateness: float) -> str | None:
    """The watermark after committing events up to ``max_event_time`` (ISO 8601, UTC)."""
    candidate = _format(_parse(max_event_time) - timedelta(seconds=allowed_lateness)) if max_event_time else None
    known = [value for value in (previous, candidate) if value]
    return max(known, key=_parse) if known else None


def first_incomplete_midnight(watermark: str | None) -> datetime | None:
    """Midnight starting the first day the watermark has not completed; earlier events are late."""
    return datetime.combine(_parse(watermark).date(), time(), timezone.utc) if watermark else None


def count_late_events(staged: DataFrame, column: str, watermark_before: str | None) -> int:
    """Rows of the batch whose event time falls on a day already complete before this commit."""
    cutoff = first_incomplete_midnight(watermark_before)
    if cutoff is None:
        return 0
    rows = staged.where(F.col(OPERATION_COLUMN) != F.lit(DELETE)) if OPERATION_COLUMN in staged.columns else staged
    # Compared as UTC wall-clock times (the session time zone is UTC), whatever the column's type.
    event_time = F.col(f"`{column}`").cast("timestamp_ntz")
    return rows.where(event_time < F.lit(cutoff.strftime("%Y-%m-%d %H:%M:%S")).cast("timestamp_ntz")).count()


def table_watermark(history: CommitHistory, streams: list[StreamSpec]) -> str | None:
    """The lowest watermark of the table's streams that track completeness (None until each has one)."""
    watermarks = [history.watermark(stream.name) for stream in streams if stream.completeness]
    known = [watermark for watermark in watermarks if watermark is not None]
    if not known or len(known) < len(watermarks):
        return None
    return min(known, key=_parse)


def complete_days(first: date, watermark: str | None) -> list[date]:
    """Days from ``first`` on that the watermark has completed (at most ``MAX_DAYS_PER_COMMIT``)."""
    if watermark is None:
        return []
    last_complete = _parse(watermark).date() - timedelta(days=1)
    count = min((last_complete - first).days + 1, MAX_DAYS_PER_COMMIT)
    return [first + timedelta(days=offset) for offset in range(max(count, 0))]
