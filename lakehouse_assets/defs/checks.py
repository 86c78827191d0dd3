"""The checks of a table: DuckDB checks on the exact snapshot a commit made (or, in a check or
publish job, on the current snapshot), the freshness check on each stream's backlog; and per
commit group the job that runs the blocking checks alone (``lakehouse check``)."""

from collections.abc import Callable
from dataclasses import dataclass

import dagster as dg

from lakehouse_assets.batches.ledger import StreamLedger
from lakehouse_assets.commit.branches import audit_state
from lakehouse_assets.commit.dead_letters import dead_letter_identifier
from lakehouse_assets.commit.tables import identifier_columns
from lakehouse_assets.config.spec import StreamSpec
from lakehouse_assets.defs import names
from lakehouse_assets.defs.check_status import blocking_check_names, blocking_expectations
from lakehouse_assets.defs.commit_groups import CommitGroup
from lakehouse_assets.defs.resources import LakehouseResource
from lakehouse_assets.errors import describe_error
from lakehouse_assets.locks import exclusive_lock, table_lock_file
from lakehouse_assets.quality import checks
from lakehouse_assets.quality.duck import iceberg_connection, read_storage_of
from lakehouse_assets.quality.lag import stream_lag_seconds
from lakehouse_assets.runtime.run_liveness import RUN_KIND_TAG


@dataclass(frozen=True)
class CheckTarget:
    """What a table's checks read: the snapshot (None: the table has none yet) and, per stream, the
    first and last batch the commit being checked published (empty when checking a snapshot alone)."""

    snapshot: checks.CommittedSnapshot | None
    ranges: dict[str, list[int]]

    def require_snapshot(self, table_identifier: str) -> checks.CommittedSnapshot:
        if self.snapshot is None:
            raise dg.Failure(f"{table_identifier} has no committed snapshot to check yet")
        return self.snapshot


@dataclass(frozen=True)
class TableCheck:
    """One check of a table, evaluated by its commit group's committer and check step (``defs.committer``)."""

    name: str
    description: str
    blocking: bool
    evaluate: Callable[[LakehouseResource, CheckTarget], dg.AssetCheckResult]

    def result(
        self, key: dg.AssetKey, lakehouse: LakehouseResource, target: CheckTarget | Callable[[], CheckTarget]
    ) -> dg.AssetCheckResult:
        """The check's result on the table ``key`` (``target`` or what it returns). An error while
        checking is a failed result with the error, so a broken check neither stops the other
        tables' checks nor passes silently; a blocking one still fails its run."""
        try:
            read_storage_of(lakehouse.lake().config.catalog)
            result = self.evaluate(lakehouse, target if isinstance(target, CheckTarget) else target())
        except Exception as error:  # noqa: BLE001 - reported as the check's result
            found = describe_error(error)
            result = dg.AssetCheckResult(
                passed=False, description=f"could not check: {error}", metadata={"found": found}
            )
        return dg.AssetCheckResult(
            asset_key=key,
            check_name=self.name,
            passed=result.passed,
            metadata=result.metadata,
            severity=result.severity,
            description=result.description,
        )


def materialized_target(
    instance: dg.DagsterInstance, lakehouse: LakehouseResource, table_identifier: str
) -> CheckTarget:
    """The snapshot and batch ranges recorded by the latest materialization of the table."""
    event = instance.get_latest_materialization_event(names.table_key(table_identifier))
    if event is None or event.asset_materialization is None:
        return CheckTarget(None, {})
    metadata = event.asset_materialization.metadata
    snapshot = checks.CommittedSnapshot(
        metadata_location=str(metadata["metadata_location"].value),
        snapshot_id=int(str(metadata["snapshot_id"].value)),
        io_properties=lakehouse.lake().file_io_properties,
    )
    ranges = metadata.get(names.RUN_RANGES_METADATA)
    recorded = ranges.value if ranges else {}
    return CheckTarget(snapshot, recorded if isinstance(recorded, dict) else {})


def current_target(lakehouse: LakehouseResource, table_identifier: str) -> CheckTarget:
    """The table's current snapshot, whoever committed it (what ``lakehouse check``, the publish
    jobs and the freshness jobs read); under ``publish: audit``, while commits await publishing,
    the audit branch's head and the batches those commits hold."""
    lake = lakehouse.lake()
    snapshot = checks.current_snapshot(lake, table_identifier)
    if snapshot is None or not lake.config.audits(table_identifier):
        return CheckTarget(snapshot, {})
    # The ranges from the very table version the snapshot was read from.
    return CheckTarget(snapshot, audit_state(snapshot.table()).unpublished_ranges())


def checked_target(instance: dg.DagsterInstance, lakehouse: LakehouseResource, table_identifier: str) -> CheckTarget:
    """What a check run on its own reads: the table's current snapshot in a check or publish job
    (``check_current_snapshot``), else the one its latest materialization recorded."""
    if lakehouse.check_current_snapshot:
        return current_target(lakehouse, table_identifier)
    return materialized_target(instance, lakehouse, table_identifier)


def _result(outcome: checks.CheckOutcome, snapshot: checks.CommittedSnapshot) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(
        passed=outcome.passed,
        description=outcome.description,
        metadata={
            **outcome.metadata,
            "snapshot_id": str(snapshot.snapshot_id),
            "found": outcome.description,
        },
    )


def _snapshot_check(
    table_identifier: str,
    name: str,
    description: str,
    verify: Callable[[checks.CommittedSnapshot], checks.CheckOutcome],
) -> TableCheck:
    """A blocking check that runs ``verify`` on the checked snapshot of the table."""

    def evaluate(lakehouse: LakehouseResource, target: CheckTarget) -> dg.AssetCheckResult:
        snapshot = target.require_snapshot(table_identifier)
        return _result(verify(snapshot), snapshot)

    return TableCheck(name, description, True, evaluate)


def table_check_registry(table_identifier: str, streams: list[StreamSpec]) -> list[TableCheck]:
    """Every check of one table: the blocking checks reading the committed snapshot with DuckDB,
    the freshness and dead-letter checks, and for change streams the change checks."""
    declared = streams[0].table_schema.columns
    expectations = blocking_expectations(streams)
    evolves = any(stream.schema_evolution for stream in streams)
    relaxes = any(stream.relaxes_required for stream in streams)
    registry = [
        (
            names.SCHEMA_CHECK,
            "The committed snapshot's columns, types and required flags are as declared.",
            lambda snapshot: checks.check_schema(iceberg_connection(), snapshot, declared, evolves, relaxes),
        ),
        (
            names.ROW_COUNT_CHECK,
            "DuckDB's row count equals the net rows of every committed batch.",
            lambda snapshot: checks.check_row_count(iceberg_connection(), snapshot),
        ),
        (
            names.SEQUENCE_CHECK,
            "Batch ranges along the ancestry have no gap, overlap or repeat.",
            checks.check_sequence_ranges,
        ),
        (
            names.DATA_FILES_CHECK,
            "No data file is referenced twice by the committed snapshot.",
            lambda snapshot: checks.check_unique_data_files(iceberg_connection(), snapshot),
        ),
    ]
    if expectations:
        registry.append(
            (
                names.EXPECTATIONS_CHECK,
                "Every row meets the streams' expectations (on_failure: block).",
                lambda snapshot: checks.check_expectations(iceberg_connection(), snapshot, expectations),
            )
        )
    table_level = [_snapshot_check(table_identifier, *entry) for entry in registry]
    table_level.extend([freshness_check(table_identifier, streams), dead_letters_check(table_identifier)])
    change_streams = [stream for stream in streams if stream.applies_changes]
    return table_level + (change_checks(table_identifier, change_streams) if change_streams else [])


def freshness_check(table_identifier: str, streams: list[StreamSpec]) -> TableCheck:
    """Fails when a stream's oldest uncommitted event is older than its ``max_lag``."""

    def lag_within_bound(lakehouse: LakehouseResource, target: CheckTarget) -> dg.AssetCheckResult:
        lake = lakehouse.lake()
        table = lake.table(table_identifier)
        current = [lake.stream(stream.name) for stream in streams]
        lags = {stream.name: stream_lag_seconds(lake.paths, stream, table) for stream in current}
        behind = [
            f"stream {stream.name}: oldest uncommitted event waited {lags[stream.name]:.0f}s > max_lag "
            f"{stream.max_lag:g}s"
            for stream in current
            if lags[stream.name] > stream.max_lag
        ]
        return dg.AssetCheckResult(
            passed=not behind,
            description="; ".join(behind) or "every stream is within its max_lag",
            metadata={
                **{f"lag_seconds.{name}": round(lag, 3) for name, lag in lags.items()},
                **{f"max_lag_seconds.{stream.name}": stream.max_lag for stream in current},
            },
        )

    return TableCheck(
        names.FRESHNESS_CHECK,
        "Every stream's oldest uncommitted event is younger than the stream's max_lag.",
        False,
        lag_within_bound,
    )


def dead_letters_check(table_identifier: str) -> TableCheck:
    """Warns (without blocking) when the batches the last commit published sent events to the
    dead-letter table, with the reasons, or wrote values as NULL that did not fit their column,
    with the columns and counts."""

    def no_new_dead_letters(lakehouse: LakehouseResource, target: CheckTarget) -> dg.AssetCheckResult:
        snapshot_checked = target.require_snapshot(table_identifier)
        lake = lakehouse.lake()
        identifier = dead_letter_identifier(table_identifier)
        connection = iceberg_connection()
        if lake.config.audits(table_identifier):
            outcomes = [
                checks.check_staged_rejects(
                    connection, stream, first, last, _staged_parquet(lake.ledger(stream), first, last)
                )
                for stream, (first, last) in sorted(target.ranges.items())
            ]
        else:
            table = lake.table(identifier)
            head = table.current_snapshot() if table else None
            snapshot = (
                checks.CommittedSnapshot(table.metadata_location, head.snapshot_id, lake.file_io_properties)
                if table and head
                else None
            )
            outcomes = [
                checks.check_no_new_dead_letters(connection, snapshot, stream, first, last)
                for stream, (first, last) in sorted(target.ranges.items())
            ]
        reasons: dict[str, int] = {}
        for outcome in outcomes:
            for reason, count in outcome.metadata.get("reasons", {}).items():
                reasons[reason] = reasons.get(reason, 0) + count
        # Values written as NULL because they did not fit their column are as loud as dead letters.
        nulled: dict[str, int] = {}
        for stream, (first, last) in sorted(target.ranges.items()):
            for column, count in checks.uncoercible_values(snapshot_checked, stream, first, last).items():
                nulled[column] = nulled.get(column, 0) + count
        descriptions = [outcome.description for outcome in outcomes]
        if nulled:
            descriptions.append(
                "values written as NULL because they do not fit their column's type: "
                + ", ".join(f"{column} {count}" for column, count in nulled.items())
            )
        return dg.AssetCheckResult(
            passed=all(outcome.passed for outcome in outcomes) and not nulled,
            severity=dg.AssetCheckSeverity.WARN,
            description="; ".join(descriptions),
            metadata={
                "dead_letters": sum(outcome.metadata.get("dead_letters", 0) for outcome in outcomes),
                "reasons": dg.JsonMetadataValue(reasons),
                "uncoercible_values": dg.JsonMetadataValue(nulled),
                "dead_letter_table": identifier,
            },
        )

    return TableCheck(
        names.DEAD_LETTERS_CHECK,
        "Warns when the committed batches sent events to the dead-letter table, with the reasons.",
        False,
        no_new_dead_letters,
    )


def _staged_parquet(ledger: StreamLedger, first: int, last: int) -> list[str]:
    """The staged Parquet of batches ``first`` to ``last`` that still have it."""
    records = ledger.batches(after=first - 1)
    return [str(r.events_path()) for r in records if r.sequence <= last and r.staged and r.events_path().is_dir()]


def _last_published_changes(ledger: StreamLedger) -> list[checks.CommittedChanges]:
    """Change batches the last committer run published; their staged Parquet is kept until the next run."""
    return [
        checks.CommittedChanges(record.sequence, record.committed.snapshot_id, str(record.events_path()))
        for record in ledger.batches(with_attempts=True)
        if record.committed and record.staged and record.events_path().is_dir()
    ]


def change_checks(table_identifier: str, streams: list[StreamSpec]) -> list[TableCheck]:
    """The checks of a table that change streams write: unique keys, and each batch applied exactly."""

    def identifier_keys_unique(lakehouse: LakehouseResource, target: CheckTarget) -> dg.AssetCheckResult:
        snapshot = target.require_snapshot(table_identifier)
        keys = identifier_columns(lakehouse.lake(), streams[0])
        return _result(checks.check_keys_unique(iceberg_connection(), snapshot, keys), snapshot)

    def changes_applied(lakehouse: LakehouseResource, target: CheckTarget) -> dg.AssetCheckResult:
        snapshot = target.require_snapshot(table_identifier)
        lake = lakehouse.lake()
        outcomes = []
        # The table lock keeps a concurrent committer pass from removing the staged Parquet being read.
        with exclusive_lock(table_lock_file(lake.paths.locks, table_identifier)):
            for stream in streams:
                stream = lake.stream(stream.name)
                keys = identifier_columns(lake, stream)
                columns = [column.name for column in checks.snapshot_columns(snapshot)]
                batches = _last_published_changes(lake.ledger(stream.name))
                outcomes.append(
                    checks.check_changes_applied(
                        iceberg_connection(), snapshot.metadata_location, batches, keys, columns, stream.order_column
                    )
                )
        merged = checks.CheckOutcome(
            all(outcome.passed for outcome in outcomes),
            "; ".join(outcome.description for outcome in outcomes),
            {key: value for outcome in outcomes for key, value in outcome.metadata.items()},
        )
        return _result(merged, snapshot)

    return [
        TableCheck(
            names.KEYS_UNIQUE_CHECK,
            "No identifier key appears twice in the committed snapshot.",
            True,
            identifier_keys_unique,
        ),
        TableCheck(
            names.CHANGES_APPLIED_CHECK,
            "On each batch's snapshot, its net deletes are absent and its upserts hold the batch's values.",
            True,
            changes_applied,
        ),
    ]


def check_job(group: CommitGroup):  # -> UnresolvedAssetJobDefinition, not exported by dagster
    """A job that runs only the blocking checks of the group's tables, on their current snapshots,
    whoever committed them: what ``lakehouse check`` runs (no Spark, no commit; run config
    ``tables`` of the group's check step narrows it)."""
    return dg.define_asset_job(
        group.check_job_name,
        selection=dg.AssetSelection.checks(
            *(
                dg.AssetCheckKey(names.table_key(table), name)
                for table, streams in group.tables.items()
                for name in blocking_check_names(streams)
            )
        ),
        # The job's default run config, which the run config a launch gives is merged into.
        config={"resources": {"lakehouse": {"config": {"check_current_snapshot": True}}}},
        tags=group.run_tags(list(group.tables)) | {RUN_KIND_TAG: "check"},
        description=f"Run the blocking checks of {group.label} on the current snapshots.",
    )
