"""Staging the batches of many routed tables at once: one Spark job per table schema, not per table.

A router leaves each table's events in route files, the landing files of the table's derived
stream, and each stream mints its batches in its own ledger. Staging them one by one costs a few
Spark jobs per table, which dominates when a cycle touches hundreds of small tables. Here the
batches whose tables have the same schema are read, converted and written by one Spark job,
partitioned by batch; each partition becomes that batch's attempt, recorded in its own ledger
exactly as ``staging.stage_batch`` records it (the first attempt wins, a repeat stages nothing
twice). What this path does not cover goes through ``stage_batch`` one batch at a time: streams
with schema evolution (each batch may add columns to its own table), and a group whose job fails
on some events (``stage_batch`` isolates them as dead letters).
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from dataclasses import dataclass
from functools import partial
from itertools import islice
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import types as T

from lakehouse_assets import faults
from lakehouse_assets.batches.ledger import EVENTS_DIR, BatchRecord
from lakehouse_assets.config.spec import ColumnSpec, StreamSpec
from lakehouse_assets.errors import describe_error
from lakehouse_assets.faults import crash_point
from lakehouse_assets.ingest.conversion import convert_events
from lakehouse_assets.ingest.inference import SAMPLE_EVENTS, infer_columns
from lakehouse_assets.ingest.landing_reader import BATCH_COLUMN, read_landing_lines
from lakehouse_assets.ingest.staged_events import staged_events
from lakehouse_assets.ingest.staging import (
    StagingSchema,
    batch_figures,
    landing_files,
    record_attempt,
    stage_batch,
    staging_schema,
)
from lakehouse_assets.lakehouse import Lakehouse

FAN_IN_DIR = "fan-in"
ABANDONED_AFTER_SECONDS = 3600
"""A group work directory this old was left by a killed staging (a group takes seconds to minutes)."""


@dataclass(frozen=True)
class PendingBatch:
    """A minted batch of a derived stream that is not staged yet."""

    stream: StreamSpec
    record: BatchRecord


@dataclass
class _Group:
    """Batches whose tables share a schema: converted together."""

    schema: StagingSchema
    batches: list[PendingBatch]


def _inferred_columns(stream: StreamSpec, files: list[str]) -> list[ColumnSpec]:
    """A new table's columns inferred from the first events of its batch's route files (written by
    the router on this host, ``routing._write_route_files``, never by an executor)."""
    sample: list[str] = []
    for file in files:
        with open(file, encoding="utf-8", errors="replace") as handle:
            sample.extend(islice(handle, SAMPLE_EVENTS - len(sample)))
        if len(sample) >= SAMPLE_EVENTS:
            break
    return infer_columns(stream, sample)


def stage_routed_batches(
    spark: SparkSession,
    lake: Lakehouse,
    router: StreamSpec,
    pending: list[PendingBatch],
    run_id: str | None,
) -> dict[str, str]:
    """Stage every pending batch, batches of tables with the same schema in one Spark job. A batch
    that cannot be staged (a route file gone, its table cannot be created, any error) holds back
    only its own table: returns the tables that could not be staged, with the error."""
    failed: dict[str, str] = {}
    groups: dict[tuple, _Group] = {}
    one_by_one: list[PendingBatch] = []
    for batch in pending:
        if batch.stream.schema_evolution:
            one_by_one.append(batch)
            continue
        try:
            columns = partial(_inferred_columns, batch.stream, landing_files(lake.paths, batch.stream, batch.record))
            schema = staging_schema(spark, lake, batch.stream, columns)
        except Exception as error:  # noqa: BLE001 - holds back this table only; reported with its traceback
            failed[batch.stream.table_identifier] = describe_error(error)
            continue
        key = (schema.table_schema.json(), tuple(schema.identifier_columns))
        groups.setdefault(key, _Group(schema, [])).batches.append(batch)
    _remove_abandoned_work(lake.paths.staging(router.name) / FAN_IN_DIR)
    for group in groups.values():
        try:
            one_by_one.extend(_stage_group(spark, lake, router, group, run_id))
        except Exception:  # noqa: BLE001 - e.g. an event the job fails on: staged alone, each batch finds out
            one_by_one.extend(group.batches)
    for batch in one_by_one:
        if batch.stream.table_identifier in failed:
            continue  # a table's batches stage in sequence: not after one that failed
        try:
            stage_batch(spark, lake, batch.stream, batch.record.sequence, run_id=run_id)
        except Exception as error:  # noqa: BLE001 - holds back this table only; reported with its traceback
            failed[batch.stream.table_identifier] = describe_error(error)
    return failed


def _remove_abandoned_work(fan_in: Path) -> None:
    """Remove group work directories a killed staging left (``ABANDONED_AFTER_SECONDS`` old)."""
    if not fan_in.is_dir():
        return
    for work in fan_in.iterdir():
        if time.time() - work.stat().st_mtime > ABANDONED_AFTER_SECONDS:
            shutil.rmtree(work, ignore_errors=True)


def _stage_group(
    spark: SparkSession, lake: Lakehouse, router: StreamSpec, group: _Group, run_id: str | None
) -> list[PendingBatch]:
    """Convert and write the group's batches in one job, partitioned by batch, then give each
    batch its partition as a new attempt and record it (the first recorded attempt wins, as in
    ``stage_batch``). Returns the batches the job wrote nothing for (none expected: every routed
    event is a staged row or a dead letter), to stage alone."""
    work = lake.paths.staging(router.name) / FAN_IN_DIR / uuid.uuid4().hex[:16]
    try:
        files: list[str] = []
        batch_of_file: list[int] = []
        for index, batch in enumerate(group.batches):
            batch_files = landing_files(lake.paths, batch.stream, batch.record)
            files.extend(batch_files)
            batch_of_file.extend([index] * len(batch_files))
        lines = read_landing_lines(spark, files, work / "inputs", batch_of_file)
        schema, stream = group.schema, group.batches[0].stream
        keys = schema.identifier_columns
        converted = convert_events(lines, schema.table_schema, stream, keys)
        with_batch = T.StructType([*schema.table_schema.fields, T.StructField(BATCH_COLUMN, T.IntegerType())])
        # The batch joins the identifier columns (if any), so a key's changes collapse within its own batch.
        staged = staged_events(converted, with_batch, [BATCH_COLUMN, *keys] if keys else [])
        output = work / "output"
        staged.write.partitionBy(BATCH_COLUMN).parquet(str(output))
        written = spark.read.parquet(str(output)).groupBy(BATCH_COLUMN)
        figures = {
            row[BATCH_COLUMN]: row.asDict()
            for row in written.agg(*batch_figures(stream, schema.table_schema)).collect()
        }
        attempts, unwritten = [], []
        for index, batch in enumerate(group.batches):
            if index not in figures:
                unwritten.append(batch)
                continue
            ledger = lake.ledger(batch.stream.name)
            attempt, attempt_dir = ledger.new_attempt(batch.record.sequence)
            attempt_dir.mkdir(parents=True)
            # The partition becomes the attempt's Parquet: a rename, the staging root is one disk.
            os.rename(output / f"{BATCH_COLUMN}={index}", attempt_dir / EVENTS_DIR)
            attempts.append((ledger, batch, attempt, figures[index]))
        crash_point(faults.WRITER_AFTER_STAGING)
        for ledger, batch, attempt, found in attempts:
            record_attempt(ledger, batch.record, attempt, found, run_id, schema)
        return unwritten
    finally:
        shutil.rmtree(work, ignore_errors=True)
