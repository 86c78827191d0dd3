"""The ``lakehouse`` command: init, ingest, serve, run, maintain, check, dlq, source, audit, status, sql, demo.

This module parses the arguments and imports the commands (and Dagster with them) only then, so
``lakehouse run --until-idle`` starts its Spark JVM first, on a thread, while Dagster loads.
"""

from __future__ import annotations

import argparse
import gc
import sys
import threading
from datetime import datetime, timezone
from pathlib import Path

from lakehouse_assets.engine.spark import start_jvm_in_background
from lakehouse_assets.errors import LakehouseError
from lakehouse_assets.ingest.micro_batching import work_may_be_waiting
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.paths import LakehousePaths
from lakehouse_assets.storage_space import STORAGE_EXIT_CODE, StorageRefusedError, storage_failure

JVM_START_WAIT_SECONDS = 60.0
DOING = {
    "init": "writing the project's files",
    "ingest": "landing events",
    "serve": "serving events",
    "run": "running the pipeline",
    "status": "reading the status",
    "maintain": "maintaining the tables",
    "check": "checking the tables",
    "dlq_replay": "replaying dead letters",
    "source_reload": "forgetting the source's checkpoint",
    "audit_publish": "publishing the audited snapshot",
    "audit_discard": "discarding the audited commits",
    "sql": "querying the tables",
    "spark_host_stop": "stopping the Spark hosts",
    "demo": "running the demo",
}
"""What each command was doing, for the one line a full or read-only file system ends it with."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lakehouse",
        description="Stream events and change data into Apache Iceberg tables, exactly once: land events, "
        "run the pipeline, query, check and maintain the tables.",
        epilog="Settings: LAKEHOUSE_CONFIG (default ./lakehouse.yaml), LAKEHOUSE_HOME (default ./.lakehouse).",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    init = commands.add_parser(
        "init", help="start a project directory: lakehouse.yaml, workspace.yaml and the Dagster instance settings"
    )
    init.add_argument("directory", nargs="?", default=".", type=Path, help="default: the current directory")
    init.set_defaults(handler="init")
    ingest = commands.add_parser("ingest", help="land NDJSON events for a stream")
    ingest.add_argument("--stream", required=True)
    ingest.add_argument("file", nargs="?", default="-", help="NDJSON file, or - for standard input")
    ingest.set_defaults(handler="ingest")
    serve = commands.add_parser(
        "serve",
        help="accept events over HTTP (POST /v1/streams/<stream>/events) for the streams with source.landing.http",
    )
    serve.add_argument("--host", help="default: http.host (127.0.0.1)")
    serve.add_argument("--port", type=int, help="default: http.port (8080)")
    serve.set_defaults(handler="serve")
    run = commands.add_parser("run", help="run the pipeline")
    run.add_argument("--until-idle", action="store_true", help="run in-process until nothing is pending")
    run.set_defaults(handler="run")
    status = commands.add_parser("status", help="per-table progress and checks")
    status.add_argument("--json", action="store_true")
    status.set_defaults(handler="status")
    maintain = commands.add_parser("maintain", help="run table maintenance now (all tables, or one)")
    maintain.add_argument("--table", help="namespace.table; default: every configured table")
    maintain.set_defaults(handler="maintain")
    check = commands.add_parser(
        "check", help="run the blocking checks on the current snapshot (all tables, or one); exit 1 if one fails"
    )
    check.add_argument("--table", help="namespace.table; default: every configured table")
    check.set_defaults(handler="check")
    dlq = commands.add_parser("dlq", help="dead letters").add_subparsers(dest="dlq_command", required=True)
    replay = dlq.add_parser("replay", help="send a table's dead letters through their stream again, after a fix")
    replay.add_argument("--table", required=True, help="namespace.table whose dead letters to replay")
    replay.add_argument("--reason", help="only dead letters whose reason contains this text")
    replay.set_defaults(handler="dlq_replay")
    source = commands.add_parser("source", help="Iceberg source streams").add_subparsers(
        dest="source_command", required=True
    )
    reload = source.add_parser("reload", help="load the source in full again (after an expired checkpoint)")
    reload.add_argument("--stream", required=True)
    reload.set_defaults(handler="source_reload")
    audit = commands.add_parser("audit", help="tables published with publish: audit").add_subparsers(
        dest="audit_command", required=True
    )
    publish = audit.add_parser("publish", help="check the audited snapshot again and publish it when the checks pass")
    publish.add_argument("--table", required=True, help="namespace.table")
    publish.set_defaults(handler="audit_publish")
    discard = audit.add_parser("discard", help="drop the audited commits; their batches are staged again")
    discard.add_argument("--table", required=True, help="namespace.table")
    discard.set_defaults(handler="audit_discard")
    host = commands.add_parser("spark-host", help="the home's warm Spark driver").add_subparsers(
        dest="host_command", required=True
    )
    stop = host.add_parser("stop", help="stop the home's Spark hosts now: each answers its calls in flight, then exits")
    stop.set_defaults(handler="spark_host_stop")

    sql = commands.add_parser(
        "sql",
        help="query the tables with DuckDB by their Iceberg names (no JVM)",
        description="Query the tables by their Iceberg names, e.g. "
        'lakehouse sql "SELECT * FROM sales.orders_dead_letters". Without a query, read statements '
        "(each ending with ;) from standard input.",
    )
    sql.add_argument("query", nargs="?", help="a SQL query; omitted: an interactive session")
    moment = sql.add_mutually_exclusive_group()
    moment.add_argument("--snapshot", type=int, help="read the table that has this snapshot id as of it")
    moment.add_argument("--at", type=_timestamp, help="read every table as it was at this time (ISO 8601, UTC)")
    shape = sql.add_mutually_exclusive_group()
    shape.add_argument("--json", dest="output", action="store_const", const="json", help="a JSON array of rows")
    shape.add_argument("--csv", dest="output", action="store_const", const="csv", help="CSV with a header")
    sql.set_defaults(handler="sql", output="table")

    demo = commands.add_parser("demo", help="generate sample events, run until idle, summarize")
    demo.add_argument("--events", type=int, default=10_000)
    scenario = demo.add_mutually_exclusive_group()
    scenario.add_argument(
        "--kafka",
        action="store_true",
        help="the Kafka scenario: a local broker (Maven's jars), a 32-partition topic of ticks, the pipeline on it",
    )
    scenario.add_argument(
        "--object-store",
        action="store_true",
        help="the tables on a local S3-compatible store and in a local Iceberg REST catalog (Maven's jars)",
    )
    demo.add_argument(
        "--keep-running", action="store_true", help="with --object-store: keep the servers up afterwards, until Ctrl-C"
    )
    demo.set_defaults(handler="demo")
    return parser


def _timestamp(text: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 time: {text!r} (e.g. 2026-11-28T09:30:00)") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def main(argv: list[str] | None = None) -> int:
    """Run the command ``argv`` names (default: this process's arguments); returns its exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.handler == "demo" and args.keep_running and not args.object_store:
        parser.error("--keep-running keeps the servers of --object-store running: give both")
    jvm_starting: threading.Thread | None = None
    try:
        if args.handler == "run" and args.until_idle:
            lake = Lakehouse.from_env()
            if work_may_be_waiting(lake):
                # The writer run's JVM starts while Dagster is imported and loads its instance
                # and definitions (about 2.5 s of a cold run), instead of after.
                jvm_starting = start_jvm_in_background(lake.config)
        if args.handler == "init":
            from lakehouse_assets.ops.init import init_project

            print("\n".join(init_project(args.directory)))
            return 0
        if args.handler == "serve":  # no Dagster, no JVM
            from lakehouse_assets.http_source.server import serve

            serve(Lakehouse.from_env(), args.host, args.port)
            return 0
        if args.handler == "spark_host_stop":  # no Dagster, no JVM
            return _stop_spark_hosts(Lakehouse.from_env())
        if args.handler == "sql":  # DuckDB only: no Dagster to import
            from lakehouse_assets.ops.sql import sql_session

            return sql_session(Lakehouse.from_env(), args.query, args.output, args.snapshot, args.at)
        # Imported only now: Dagster's import is part of what the JVM's start overlaps.
        from lakehouse_assets.cli import commands

        return getattr(commands, args.handler)(args)
    except Exception as error:
        if jvm_starting is not None:
            # A JVM still starting when the process exits prints Spark's stack traces of its
            # interrupted start after the command's one line.
            jvm_starting.join(JVM_START_WAIT_SECONDS)
        full = error if isinstance(error, StorageRefusedError) else None
        full = full or storage_failure(error, DOING[args.handler], _written())
        if full is not None:
            print(f"lakehouse: {full}", file=sys.stderr)
            return STORAGE_EXIT_CODE
        if not isinstance(error, LakehouseError):
            raise
        print(f"lakehouse: {error}", file=sys.stderr)
        return 2


def _stop_spark_hosts(lake: Lakehouse) -> int:
    """``lakehouse spark-host stop``: one line per host stopped, 1 if one still runs after the wait."""
    from lakehouse_assets.engine.spark_host import stop_hosts

    stopped = stop_hosts(lake)
    if not stopped:
        print("no Spark host runs for this home")
    for pid, exited in stopped.items():
        print(f"stopped the Spark host {pid}" if exited else f"the Spark host {pid} still runs (SIGTERM sent)")
    return 0 if all(stopped.values()) else 1


def _written() -> list[Path]:
    """The directories a command writes to (``LakehousePaths.written_directories``)."""
    return LakehousePaths.from_env().written_directories()


def entry_point() -> None:
    """The ``lakehouse`` command: ``main`` on this process's arguments, then exit with its code."""
    code = main()
    # Nothing is left to do but exit. Python's final garbage collections would walk every object
    # Dagster and PySpark made (0.5-0.7 s after a writer run, measured); frozen ones are skipped.
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    entry_point()
