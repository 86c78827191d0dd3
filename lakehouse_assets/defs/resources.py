"""Thin resources: where the lakehouse lives, and Spark (the home's warm Spark host, or a JVM of
the run's own, made by dagster-pyspark's resource)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import dagster as dg
from dagster_pyspark import LazyPySparkResource

from lakehouse_assets.config.spec import LakehouseConfig
from lakehouse_assets.engine.spark import lakehouse_session, static_spark_conf
from lakehouse_assets.engine.spark_host import call_on_host
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.paths import LakehousePaths
from lakehouse_assets.runtime.run_liveness import LIVENESS_TAG, hold_run_lock, liveness_label
from lakehouse_assets.storage_space import named_storage_failures


class LakehouseResource(dg.ConfigurableResource):
    """The lakehouse home (``$LAKEHOUSE_HOME``) and configuration (``$LAKEHOUSE_CONFIG``)."""

    until_idle: bool = False
    """Set by ``lakehouse run --until-idle``, which runs every request synchronously itself: cut
    every pending event into batches regardless of the flush triggers, commit regardless of
    ``commit_interval``, do not wait for runs that other processes left in progress, and leave new
    routed tables to the definitions it rebuilds."""

    check_current_snapshot: bool = False
    """Set by the check jobs (``lakehouse check``) and the publish jobs: the table checks read the
    table's current snapshot (under ``publish: audit`` the audit branch's while it holds unpublished
    commits), whoever committed it, instead of the one its last materialization recorded."""

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        """Take the run's liveness lock for this process and name it in the run's tags, so run
        monitoring can tell when the process running it is gone (``lakehouse_assets.runtime.run_launcher``)."""
        if context.run is None or context.instance is None:
            return
        paths = LakehousePaths.from_env()
        with named_storage_failures("taking the run's liveness lock", paths.written_directories()):
            lock_file = hold_run_lock(paths, context.run.run_id)
        context.instance.add_run_tags(context.run.run_id, {LIVENESS_TAG: liveness_label(lock_file)})

    def lake(self) -> Lakehouse:
        """The lakehouse as it is configured now. Not kept for the run: routing adds a derived
        stream per new table while a run goes on, and ``load_config`` parses each configuration
        text once, so this costs a file read and a listing of ``routes/``."""
        return Lakehouse.from_env()


class SparkResource(dg.ConfigurableResource):
    """Spark with catalog ``lake``: the home's warm Spark host, or a JVM of this process started
    on first use (never at sensor ticks) by dagster-pyspark's ``LazyPySparkResource``."""

    pyspark: LazyPySparkResource
    """The run's own JVM, configured with the engine's static Spark settings
    (``engine.spark.static_spark_conf``), which the Spark host starts with too; shown as this
    resource's configuration in the Dagster UI. Settings for every run belong in ``lakehouse.yaml``
    (``spark:``): a run's own override reaches only a run with its own JVM, never the host's."""

    use_host: bool = True
    """Send engine calls to the home's Spark host when ``spark_host.enabled``; runs that
    ``lakehouse`` executes in its own process (``run --until-idle``, ``maintain``, ``audit``) set
    it to false and keep one JVM in that process."""

    @classmethod
    def of(cls, config: LakehouseConfig) -> SparkResource:
        """The resource of the definitions of ``config``."""
        return cls(pyspark=LazyPySparkResource(spark_config=static_spark_conf(config)))

    def run(self, lake: Lakehouse, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``function(spark, lake, *args, **kwargs)``, an engine call: on the Spark host when
        ``spark_host.enabled`` and ``use_host``, else on a session of this process."""
        with named_storage_failures(function.__name__, lake.paths.written_directories()):
            if lake.config.spark_host.enabled and self.use_host:
                return call_on_host(lake, function, *args, **kwargs)
            session = lakehouse_session(lake, start=lambda: self.pyspark.spark_session)
            return function(session, lake, *args, **kwargs)
