"""What a test process's own JVM gets and the ``lakehouse`` processes a test starts do not.

Spark's launcher reads both settings from the environment of the process that starts a JVM
(``conftest.py`` sets them for the session); ``fault_injection.pipeline.process_env`` removes
them for a started ``lakehouse`` process, which has only what its config and the session's
``JAVA_TOOL_OPTIONS`` give it.
"""

from __future__ import annotations

from collections.abc import Mapping

# Jars Spark's launcher appends to a JVM's class path: the test processes' JVMs get PostgreSQL's
# JDBC driver and the AWS SDK with it.
TEST_JVM_CLASS_PATH_ENV = "SPARK_DIST_CLASSPATH"
# Options Spark's launcher puts on a driver JVM's command line, after ``JAVA_TOOL_OPTIONS``, so they
# win over the session's. A test process's JVM lives as long as its worker and runs hundreds of warm
# rounds: the optimizing compiler (C2) pays for itself there, while the short-lived JVMs of the
# processes the tests start and kill keep the first tier only (``docs/benchmarks.md``).
TEST_JVM_OPTIONS_ENV = "SPARK_SUBMIT_OPTS"
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=4"


def started_process_env(environment: Mapping[str, str]) -> dict[str, str]:
    """``environment`` without what only the test processes' own JVMs get."""
    return {
        name: value
        for name, value in environment.items()
        if name not in (TEST_JVM_CLASS_PATH_ENV, TEST_JVM_OPTIONS_ENV)
    }
