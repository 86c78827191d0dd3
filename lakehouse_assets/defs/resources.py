"""Thin resources: where the lakehouse lives, and a Spark session started only when a run needs it."""

from __future__ import annotations

import dagster as dg
from pyspark.sql import SparkSession

from lakehouse_assets.config import LakehouseConfig, load_config
from lakehouse_assets.paths import LakehousePaths
from lakehouse_assets.spark import lakehouse_session


class LakehouseResource(dg.ConfigurableResource):
    """The lakehouse home (``$LAKEHOUSE_HOME``) and configuration (``$LAKEHOUSE_CONFIG``)."""

    until_idle: bool = False
    """Set by ``lakehouse run --until-idle``, which runs every request synchronously itself: cut
    every pending event into batches regardless of the flush triggers, commit regardless of
    ``commit_interval``, do not wait for runs that other processes left in progress, and leave new
    routed tables to the definitions it rebuilds."""

    def paths(self) -> LakehousePaths:
        return LakehousePaths.from_env()

    def config(self) -> LakehouseConfig:
        return load_config()


class SparkResource(dg.ConfigurableResource):
    """A Spark session with catalog ``lake``; the JVM starts on first use, never at sensor ticks."""

    def session(self, lakehouse: LakehouseResource) -> SparkSession:
        return lakehouse_session(lakehouse.config(), lakehouse.paths())
