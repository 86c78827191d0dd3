"""``lakehouse`` in a process of its own whose Spark is the test worker's warm JVM.

A fault test kills a real process at a named point, and most of what a cold ``lakehouse`` process
costs is its JVM: about 12.5 CPU-seconds on 2 cores, against 7 for the same round in a process
attached to a running JVM (``docs/benchmarks.md``). So the processes a test kills or holds at a
fault point are, unless the test asks for a cold one, this module: it connects PySpark to the
worker's JVM through the gateway the worker names (``PYSPARK_GATEWAY_PORT`` and
``PYSPARK_GATEWAY_SECRET``), wraps that JVM's Spark context and default session, and then runs
the ``lakehouse`` command. Its sessions (one per home, ``lakehouse_session``), its locks and its
Dagster runs are its own; the JVM is shared. The tests fork these processes from a server that
imported this module once (``forked_processes``); ``python -m`` runs it alike.

What such a kill does not reproduce (``docs/guarantees.md``): the JVM dying with the process, and
a JVM of its own. Work the process had already handed to the JVM on another thread finishes there
after the kill, and two attached processes share the JVM's in-memory lock around a Hadoop-catalog
commit. The tests that need either run cold processes (``cold=True``).

PySpark has no public way to attach to a running context: ``SparkContext(jsc=...)`` and
``SparkSession(sc)`` wrap the JVM's context and its default session. The process never stops them
(that would stop the worker's): it only exits.
"""

from __future__ import annotations

import os
import signal

from pyspark import SparkContext
from pyspark.java_gateway import launch_gateway
from pyspark.sql import SparkSession

GATEWAY_ENVS = ("PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET")


def attach_to_running_jvm() -> None:
    """Make the JVM named by ``PYSPARK_GATEWAY_PORT`` this process's Spark (context and session)."""
    if not all(name in os.environ for name in GATEWAY_ENVS):
        raise SystemExit(f"attached_cli: {' and '.join(GATEWAY_ENVS)} must name the test worker's JVM")
    gateway = launch_gateway()  # with the port set, PySpark connects instead of starting a JVM
    for name in GATEWAY_ENVS:  # a process this one starts gets a JVM of its own
        del os.environ[name]
    jvm = gateway.jvm
    running = jvm.org.apache.spark.SparkContext.getOrCreate()
    context = SparkContext(gateway=gateway, jsc=jvm.org.apache.spark.api.java.JavaSparkContext(running))
    # PySpark's SIGINT handler would cancel every job of the shared JVM, the worker's too.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    SparkSession(context)


def _require_local_master() -> None:
    """Refuse a configuration whose Spark master is not the worker's: its settings would be
    silently ignored (a JVM's static settings are fixed when it starts)."""
    from lakehouse_assets.config.loader import load_config
    from lakehouse_assets.engine.spark import static_spark_conf
    from lakehouse_assets.errors import LakehouseError

    try:
        wanted = static_spark_conf(load_config())["spark.master"]
    except LakehouseError:
        return  # the command reports the configuration's error itself
    running = SparkContext.getOrCreate().master
    if wanted != running:
        raise SystemExit(f"attached_cli: the configuration wants master {wanted}, the worker's JVM runs {running}")


def main() -> None:
    attach_to_running_jvm()
    _require_local_master()
    from lakehouse_assets.cli import main as cli

    cli.entry_point()


if __name__ == "__main__":
    main()
