"""What each ``lakehouse`` command does: one function per command, given the arguments ``cli`` parsed."""

from __future__ import annotations

import argparse
import json
import sys

import dagster as dg

from lakehouse_assets.batches.landing import land_events
from lakehouse_assets.cli.demo import run_demo
from lakehouse_assets.cli.kafka_demo import run_kafka_demo
from lakehouse_assets.cli.object_store_demo import run_object_store_demo
from lakehouse_assets.cli.status import lakehouse_status
from lakehouse_assets.commit.tables import require_static_tables
from lakehouse_assets.config.loader import load_config
from lakehouse_assets.config.spec import LakehouseConfig
from lakehouse_assets.definitions import build_definitions
from lakehouse_assets.defs import names
from lakehouse_assets.defs.check_status import blocking_check_names
from lakehouse_assets.defs.commit_groups import CommitGroup, commit_groups, groups_by_table
from lakehouse_assets.errors import ConfigError, IngestError
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.ops.replay import replay_dead_letters
from lakehouse_assets.paths import LakehousePaths
from lakehouse_assets.quality.checks import current_snapshot
from lakehouse_assets.runner import dagster_instance, raise_if_storage_refused, run_job, run_pipeline_until_idle
from lakehouse_assets.runtime.run_failures import failure_line
from lakehouse_assets.source.iceberg_source import forget_cursor
from lakehouse_assets.storage_space import StorageRefusedError, format_bytes


def ingest(args: argparse.Namespace) -> int:
    lake = Lakehouse.from_env()
    stream = lake.stream(args.stream)
    if stream.iceberg_source:
        raise ConfigError(f"stream {stream.name!r} takes its events from Iceberg table {stream.source_table.table}")
    refusal = lake.storage_room().producer_refusal()
    if refusal:
        raise StorageRefusedError(refusal)
    if args.file == "-":
        landed = land_events(lake.paths, stream, sys.stdin.buffer, origin="stdin")
    else:
        try:
            handle = open(args.file, "rb")  # noqa: SIM115 - closed below; opening is what can fail here
        except OSError as error:
            raise IngestError(
                f"cannot read {args.file}: {error.strerror}; give an NDJSON file, or - for standard input"
            ) from None
        with handle:
            landed = land_events(lake.paths, stream, handle, origin=args.file)
    for path in landed:
        print(f"landed {path}")
    if not landed:
        print("no events in input; nothing landed")
    return 0


def run(args: argparse.Namespace) -> int:
    if not args.until_idle:
        print("use `dagster dev` for a long-running pipeline, or `lakehouse run --until-idle`", file=sys.stderr)
        return 2
    lake = Lakehouse.from_env()
    require_static_tables(lake)
    with dagster_instance(lake.paths) as instance:
        report = run_pipeline_until_idle(instance)
    print(f"idle: {len(report.succeeded)} runs succeeded, {len(report.failed)} failed")
    return 1 if report.failed else 0


def _selected_tables(config: LakehouseConfig, table: str | None) -> list[str]:
    """``[table]``, or every configured table when it is None; ConfigError naming an unknown one."""
    if table is None:
        return list(config.tables)
    if table not in config.tables:
        raise ConfigError(f"unknown table {table!r}; configured tables: {', '.join(config.tables)}")
    return [table]


def _by_group(config: LakehouseConfig, tables: list[str]) -> list[tuple[CommitGroup, list[str]]]:
    """``tables`` by the commit group that commits them (``defs.commit_groups``)."""
    group_of = groups_by_table(commit_groups(config))
    by_group: dict[str, tuple[CommitGroup, list[str]]] = {}
    for table in tables:
        group = group_of[table]
        by_group.setdefault(group.commit_job_name, (group, []))[1].append(table)
    return list(by_group.values())


def _maintenance_runs(config: LakehouseConfig, tables: list[str]) -> list[tuple[str, str, dict, list[str]]]:
    """The maintenance runs that cover ``tables``: (job, op, run config, tables), one per commit group."""
    return [
        (
            group.maintenance_job_name,
            group.maintenance_op_name,
            _tables_config(group.maintenance_op_name, selected),
            selected,
        )
        for group, selected in _by_group(config, tables)
    ]


def _tables_config(op_name: str, tables: list[str]) -> dict:
    """The run config that narrows a group's op to ``tables``."""
    return {"ops": {op_name: {"config": {"tables": tables}}}}


def maintain(args: argparse.Namespace) -> int:
    lake = Lakehouse.from_env()
    tables = _selected_tables(lake.config, args.table)
    repository = build_definitions(lake.config).get_repository_def()
    failed = 0
    with dagster_instance(lake.paths) as instance:
        for job_name, op_name, run_config, covered in _maintenance_runs(lake.config, tables):
            result = run_job(repository.get_job(job_name), instance, run_config)
            for observation in result.asset_observations_for_node(op_name):
                print(f"{observation.asset_key.to_user_string().replace('/', '.')}:")
                for key, entry in observation.metadata.items():
                    print(f"  {key}: {entry.value}")
            if not result.success:
                failed += 1
                label = f"{', '.join(covered)}: maintenance run {result.run_id}"
                # A full disk ends the command in one line (every other run would fail alike).
                raise_if_storage_refused(result, label)
                reason = failure_line(result.all_events) or "see `dagster dev` for its logs"
                print(f"{label} FAILED: {reason}")
    return 1 if failed else 0


def _print_check_results(table: str, check_names: list[str], result: dg.ExecuteInProcessResult) -> int:
    """One line per check of the table in the run: passed, FAILED with what it found, or ERROR (no
    verdict); returns how many did not pass."""
    key = names.table_key(table)
    evaluations = {e.check_name: e for e in result.get_asset_check_evaluations() if e.asset_key == key}
    for name in check_names:
        evaluation = evaluations.get(name)
        if evaluation is None:
            print(f"{table} {name}: ERROR: no verdict; run {result.run_id} failed (see `dagster dev` for its logs)")
        else:
            print(f"{table} {name}: {'passed' if evaluation.passed else 'FAILED'}: {evaluation.description}")
    return sum(1 for name in check_names if name not in evaluations or not evaluations[name].passed)


def _check_runs(
    definitions: dg.Definitions, config: LakehouseConfig, tables: list[str]
) -> list[tuple[dg.JobDefinition, dict, list[str]]]:
    """The runs that check ``tables`` on their current snapshots: (job, run config, tables), one
    per commit group."""
    return [
        (definitions.resolve_job_def(group.check_job_name), _tables_config(group.checks_op_name, selected), selected)
        for group, selected in _by_group(config, tables)
    ]


def check(args: argparse.Namespace) -> int:
    lake = Lakehouse.from_env()
    tables = []
    for table in _selected_tables(lake.config, args.table):
        if current_snapshot(lake, table) is None:
            print(f"{table}: no snapshot yet; nothing to check")
        else:
            tables.append(table)
    not_passed = 0
    with dagster_instance(lake.paths) as instance:
        for job, run_config, covered in _check_runs(build_definitions(lake.config), lake.config, tables):
            result = run_job(job, instance, run_config)
            for table in covered:
                not_passed += _print_check_results(table, blocking_check_names(lake.config.tables[table]), result)
    print(f"{not_passed} blocking checks did not pass" if not_passed else "every blocking check passed")
    return 1 if not_passed else 0


def dlq_replay(args: argparse.Namespace) -> int:
    report = replay_dead_letters(Lakehouse.from_env(), args.table, args.reason)
    if report.landed and not args.reason:
        print(
            "note: every dead letter of the table was landed again; those whose cause is not fixed yet (the "
            "configuration, the table) come back as dead letters with their new reason. Use --reason TEXT to "
            "replay only the ones a fix addresses."
        )
    for stream, count in report.landed.items():
        print(f"stream {stream}: {count} dead letters landed again; they leave the dead-letter table when they commit")
    if not report.landed:
        print("no dead letters to replay")
    if report.already_pending:
        print(f"{report.already_pending} dead letters are in a replay that has not committed yet; skipped")
    if report.not_replayable:
        print(f"{report.not_replayable} dead letters are not JSON objects and cannot be replayed")
    return 0


def source_reload(args: argparse.Namespace) -> int:
    stream = load_config().stream(args.stream)
    if not stream.iceberg_source:
        raise ConfigError(f"stream {stream.name!r} has no Iceberg source")
    forget_cursor(LakehousePaths.from_env(), stream)
    print(
        f"stream {stream.name}: the next source run loads {stream.source_table.table} in full "
        "(upserts every row, deletes downstream rows the source no longer has), then follows its changes"
    )
    return 0


def _print_storage(storage: dict) -> None:
    total = format_bytes(storage["storage_total_bytes"])
    room = (
        f"read-only ({total})"
        if storage["storage_read_only"]
        else f"{format_bytes(storage['storage_free_bytes'])} free of {total}"
    )
    print(
        f"storage root {storage['storage_root']}: {room}; "
        f"{format_bytes(storage['backlog_bytes'])} landed and not committed (committing it needs about "
        f"{format_bytes(storage['backlog_commit_bytes'])}); producers are refused below "
        f"{format_bytes(storage['producers_refused_below_bytes'])} free"
    )
    print(f"Spark's scratch {storage['spark_scratch']}: {format_bytes(storage['spark_scratch_free_bytes'])} free")


def _print_status(entries: list[dict]) -> None:
    if entries:
        _print_storage(entries[0]["storage"])
    for entry in entries:
        if not entry["exists"]:
            print(f"{entry['table']}: not created yet")
        else:
            print(
                f"{entry['table']}: snapshot {entry['snapshot_id']}, {entry['table_rows']} rows, "
                f"{entry['table_data_files']} data files (avg {entry['table_avg_file_bytes']} bytes), "
                f"{entry['table_delete_files']} delete files, {entry['table_snapshots']} snapshots, "
                f"metadata {entry['table_metadata_bytes']} bytes"
            )
        for stream in entry["streams"]:
            print(
                f"  stream {stream['stream']}: committed through batch {stream['committed_sequence']}; "
                f"{stream['batches_staged']} batches staged (written, awaiting their commit) and "
                f"{stream['batches_minted']} cut (files chosen, awaiting their writer run); "
                f"{stream['landing_files_pending']} landing files ({stream['landing_bytes_pending']} bytes) not "
                f"batched; lag {stream['lag_seconds']:.0f}s (max_lag {stream['max_lag_seconds']:g}s)"
            )
            if stream["held_back"]:
                print(f"    {stream['held_back']}")
            if stream.get("kafka_error"):
                print(f"    kafka: {stream['kafka_error']}")
            elif "kafka_partitions" in stream:
                print(f"    kafka: {stream['kafka_lag']} records not committed")
                for partition in stream["kafka_partitions"]:
                    print(
                        f"      {partition['partition']}: committed offset {partition['committed_offset']}, "
                        f"end {partition['end_offset']}, lag {partition['lag']}"
                    )
            if "source_table" in stream:
                print(
                    f"    source {stream['source_table']}: synced through snapshot "
                    f"{stream['source_snapshot_synced']}, current {stream['source_snapshot_current']}"
                )
        if entry["publish"] == "audit":
            waiting = entry["unpublished_batches"]
            print(
                f"  audit branch: snapshot {entry['audit_snapshot_id']}; "
                + (f"batches {waiting} await publishing" if waiting else "nothing awaits publishing")
            )
        for check, status in entry["last_checks"].items():
            print(f"  check {check}: {status}")


def status(args: argparse.Namespace) -> int:
    lake = Lakehouse.from_env()
    with dagster_instance(lake.paths) as instance:
        entries = lakehouse_status(lake, instance)
    if args.json:
        print(json.dumps(entries, indent=2))
    else:
        _print_status(entries)
    return 0


def _run_audit_job(table: str, job_name: str) -> dg.ExecuteInProcessResult:
    """Run one of an audited table's jobs in this process, recorded in the Dagster instance."""

    lake = Lakehouse.from_env()
    if table not in lake.config.tables:
        raise ConfigError(f"unknown table {table!r}; configured tables: {', '.join(lake.config.tables)}")
    if not lake.config.audits(table):
        raise ConfigError(f"{table} is published directly (publish: direct); it has no audit branch")
    with dagster_instance(lake.paths) as instance:
        return run_job(build_definitions(lake.config).resolve_job_def(job_name), instance)


def audit_publish(args: argparse.Namespace) -> int:
    result = _run_audit_job(args.table, names.publish_job_name(args.table))
    for check in result.get_asset_check_evaluations():
        found = check.metadata.get("found")
        verdict = "passed" if check.passed else "FAILED"
        print(f"check {check.check_name}: {verdict}" + (f": {found.value}" if found else ""))
    published = result.asset_materializations_for_node(names.published_key(args.table).to_python_identifier())
    for materialization in published:
        metadata = materialization.metadata
        print(
            f"{args.table}: main now at snapshot {metadata['snapshot_id'].value} "
            f"(batches {metadata['published_batches'].value})"
        )
    if not result.success:
        print(f"{args.table}: not published; run {result.run_id} failed (see `dagster dev` for its logs)")
        return 1
    if not published:
        print(f"{args.table}: nothing awaits publishing")
    return 0


def audit_discard(args: argparse.Namespace) -> int:
    result = _run_audit_job(args.table, names.discard_job_name(args.table))
    observations = result.asset_observations_for_node(names.discard_op_name(args.table))
    if not result.success:
        failure = result.failure_data_for_node(names.discard_op_name(args.table))
        reason = failure.user_failure_data.description if failure and failure.user_failure_data else None
        print(f"{args.table}: discard run {result.run_id} FAILED: {reason or 'see `dagster dev` for its logs'}")
        return 1
    if not observations:
        print(f"{args.table}: the audit branch holds nothing unpublished; nothing to discard")
    for observation in observations:
        metadata = observation.metadata
        print(
            f"{args.table}: discarded audited snapshot {metadata['discarded_snapshot_id'].value}; the audit branch "
            f"is back at main. Batches {metadata['batches_to_stage_again'].value} are staged again from their "
            "landing files, with the current configuration, by the next committer run"
        )
    return 0


def demo(args: argparse.Namespace) -> int:
    if args.object_store:
        return run_object_store_demo(args.events, args.keep_running)
    return run_kafka_demo(args.events) if args.kafka else run_demo(args.events)
