"""A class-data-sharing archive for the suite's JVMs: built once per test session, used by all.

A JVM started with ``-XX:SharedArchiveFile`` maps the classes the archive holds (Spark, Iceberg,
Parquet, as one pipeline round loads them) instead of loading and verifying them from the jars:
a cold ``lakehouse run`` takes about 7.5 s instead of 9.6 s on 2 cores (``docs/benchmarks.md``).
A JVM whose class path does not start with the archive's, or of another Java, does without it.

``python -m lakehouse_assets_tests.class_data_archive ARCHIVE`` builds it: one round of the fault
pipeline (an append and a change stream with dead letters) staged and committed in a temporary
home, in a JVM that writes the classes it loaded to ``ARCHIVE`` when it exits.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ARCHIVE_OPTION = "-XX:SharedArchiveFile="
BUILD_TIMEOUT_SECONDS = 300


def build_archive(archive: Path) -> bool:
    """Build ``archive`` in a process of its own; False (with the reason on stderr) if it failed."""
    try:
        built = subprocess.run(
            [sys.executable, "-m", __name__, str(archive)],
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_SECONDS,
            check=False,
        )
    except subprocess.TimeoutExpired:
        print(f"class data archive: not built within {BUILD_TIMEOUT_SECONDS} s", file=sys.stderr)
        return False
    if built.returncode != 0 or not archive.is_file():
        print(f"class data archive: not built:\n{built.stdout[-2000:]}{built.stderr[-2000:]}", file=sys.stderr)
        return False
    return True


def _run_one_round(archive: Path, work: Path) -> None:
    """Stage and commit one round of the fault pipeline's streams, on Spark alone (no Dagster)."""
    import yaml

    from lakehouse_assets.config.loader import load_config
    from lakehouse_assets.engine.spark import lakehouse_session, static_spark_conf
    from lakehouse_assets.ingest.micro_batching import mint_next_batch
    from lakehouse_assets.ingest.staging import stage_batch
    from lakehouse_assets.ingest.table_commits import commit_table
    from lakehouse_assets.lakehouse import Lakehouse
    from lakehouse_assets_tests.fault_injection.pipeline import PIPELINE, land_round

    os.environ.update(LAKEHOUSE_HOME=str(work / "lakehouse"), LAKEHOUSE_CONFIG=str(work / "lakehouse.yaml"))
    config_file = work / "lakehouse.yaml"
    config_file.write_text(yaml.safe_dump(PIPELINE))
    # Only the Spark JVM writes the archive (not the launcher JVM spark-submit starts first).
    java_options = static_spark_conf(load_config())["spark.driver.extraJavaOptions"]
    java_options += f" -XX:ArchiveClassesAtExit={archive}"
    config_file.write_text(yaml.safe_dump({**PIPELINE, "spark": {"spark.driver.extraJavaOptions": java_options}}))
    lake = Lakehouse.from_env()
    spark = lakehouse_session(lake)
    land_round(lake, 0)
    for stream in lake.config.streams:
        batch, _ = mint_next_batch(lake, stream, drain=True)
        stage_batch(spark, lake, stream, batch.sequence)
        commit_table(spark, lake, stream.table_identifier, "class-data-archive")


def _stop_jvm() -> None:
    """Stop Spark and wait for its JVM to exit: the archive is written on a normal exit only."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if SparkContext._active_spark_context is not None:
        SparkContext._active_spark_context.stop()
    if gateway is not None:
        gateway.shutdown()
        gateway.proc.stdin.close()  # the JVM exits when its standard input closes
        gateway.proc.wait(timeout=120)


def main(archive: str) -> None:
    with tempfile.TemporaryDirectory(prefix="class-data-archive-") as work:
        _run_one_round(Path(archive), Path(work))
        _stop_jvm()


if __name__ == "__main__":
    main(sys.argv[1])
