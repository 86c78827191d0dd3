"""``lakehouse`` in a process of its own whose Spark is the test worker's warm JVM.

A fault test kills a real process at a named point, and most of what a cold ``lakehouse`` process
costs is its JVM: about 12.5 CPU-seconds on 2 cores, against 7 for the same round in a process
attached to a running JVM (``docs/benchmarks.md``). So the processes a test kills or holds at a
fault point are, unless the test asks for a cold one, this module: it connects PySpark to the
worker's JVM through the gateway the worker names (``PYSPARK_GATEWAY_PORT`` and
``PYSPARK_GATEWAY_SECRET``, which PySpark reads itself), wraps that JVM's Spark context and default
session, and then runs ``lakehouse <arguments>`` as the ``lakehouse`` command does. Its own
sessions (one per home, ``lakehouse_session``) and locks are its own; the JVM is shared.

What such a kill does not reproduce, the JVM dying with the process, each family of fault points
proves with one cold process (``cold=True``): a SIGKILL there ends the JVM too.

PySpark has no public way to attach to a running context: ``SparkContext(jsc=...)`` and
``SparkSession(sc)`` wrap the JVM's context and default session, as PySpark's own notebooks do.
The process never stops them (that would stop the worker's): it only exits.
"""

from __future__ import annotations

import sys

from pyspark import SparkContext
from pyspark.java_gateway import launch_gateway
from pyspark.sql import SparkSession


def attach_to_running_jvm() -> None:
    """Make the JVM named by ``PYSPARK_GATEWAY_PORT`` this process's Spark (context and session)."""
    gateway = launch_gateway()  # connects when PYSPARK_GATEWAY_PORT is set; starts no JVM
    jvm = gateway.jvm
    running = jvm.org.apache.spark.SparkContext.getOrCreate()
    SparkSession(SparkContext(gateway=gateway, jsc=jvm.org.apache.spark.api.java.JavaSparkContext(running)))


def main() -> int:
    attach_to_running_jvm()
    from lakehouse_assets import cli

    return cli.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
