"""Thin resources: where the lakehouse lives, and Spark, started only when a run needs it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import dagster as dg
from pyspark.sql import SparkSession

from lakehouse_assets.config import LakehouseConfig, load_config
from lakehouse_assets.paths import LakehousePaths
from lakehouse_assets.spark import lakehouse_session
from lakehouse_assets.spark_host import call_on_host


class LakehouseResource(dg.ConfigurableResource):
    """The lakehouse home (``$LAKEHOUSE_HOME``) and configuration (``$LAKEHOUSE_CONFIG``)."""

    until_idle: bool = False
    """Set by ``lakehouse run --until-idle``, which runs every request synchronously itself: cut
    every pending event into batches regardless of the flush triggers, commit regardless of
    ``commit_interval``, do not wait for runs that other processes left in progress, and leave new
    routed tables to the definitions it rebuilds."""

    check_current_snapshot: bool = False
    """Set by the check jobs (``lakehouse check``): the table checks read the table's current
    snapshot (under ``publish: audit`` the audit branch's while it holds unpublished commits)
    instead of the one its last materialization recorded."""

    def paths(self) -> LakehousePaths:
        return LakehousePaths.from_env()

    def config(self) -> LakehouseConfig:
        return load_config()


class SparkResource(dg.ConfigurableResource):
    """Spark with catalog ``lake``: the home's warm Spark host, or a JVM of this process started
    on first use (never at sensor ticks)."""

    use_host: bool = True
    """Send engine calls to the home's Spark host when ``spark_host.enabled``; runs that
    ``lakehouse`` executes in its own process (``run --until-idle``, ``maintain``, ``audit``) set
    it to false and keep one JVM in that process."""

    def session(self, lakehouse: LakehouseResource) -> SparkSession:
        """A Spark session in this process."""
        return lakehouse_session(lakehouse.config(), lakehouse.paths())

    def run(self, lakehouse: LakehouseResource, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``function(spark, *args, **kwargs)``, an engine call: on the Spark host when
        ``spark_host.enabled`` and ``use_host``, else on a session of this process."""
        config = lakehouse.config()
        if config.spark_host.enabled and self.use_host:
            return call_on_host(config, lakehouse.paths(), function, *args, **kwargs)
        return function(self.session(lakehouse), *args, **kwargs)
