"""Assemble the Dagster definitions from the pipeline configuration (loaded by ``workspace.yaml``)."""

from __future__ import annotations

import dagster as dg

from lakehouse_assets.catalog.tables import require_static_tables
from lakehouse_assets.config import LakehouseConfig, StreamSpec
from lakehouse_assets.defs import names
from lakehouse_assets.defs.assets import complete_days_asset, router_asset, staged_batches_asset, table_asset
from lakehouse_assets.defs.checks import check_job, table_checks
from lakehouse_assets.defs.freshness import freshness_job, freshness_schedules
from lakehouse_assets.defs.iceberg_source import source_assets, source_job, source_sensor
from lakehouse_assets.defs.maintenance import maintenance_job, maintenance_schedules, routed_maintenance_job
from lakehouse_assets.defs.publishing import discard_job, publish_job, published_asset
from lakehouse_assets.defs.resources import LakehouseResource, SparkResource
from lakehouse_assets.defs.routed_tables import (
    routed_check_job,
    routed_commit_job,
    routed_freshness_job,
    routed_tables_asset,
    routed_tables_keys,
    routed_tables_sensor,
)
from lakehouse_assets.defs.sensors import landing_sensor, staged_batches_sensor
from lakehouse_assets.lakehouse import Lakehouse


def build_definitions(config: LakehouseConfig) -> dg.Definitions:
    """Per stream a writer asset, job (stage, then commit) and landing sensor (and for an Iceberg
    source its change export, search export, job and polling sensor); per router one committer
    multi-asset, commit, check, freshness and maintenance job and sensor for all the tables only
    it feeds (``defs.routed_tables``); per other table a committer asset,
    checks, commit job (for what writer runs left) and sensor (under ``publish: audit`` also the
    published asset, publish and discard jobs), maintenance and freshness jobs with their schedules,
    and a job that runs its blocking checks alone."""
    assets: list[dg.AssetsDefinition | dg.AssetSpec] = []
    asset_checks: list[dg.AssetChecksDefinition] = []
    jobs = []
    sensors: list[dg.SensorDefinition] = []
    loaded_tables = frozenset(config.tables)
    for stream in config.streams:
        if stream.routed_from and config.router_of(stream.table_identifier):
            continue  # staged and committed by its router's committer (routed_tables)
        assets.append(router_asset(stream, loaded_tables) if stream.is_router else staged_batches_asset(stream))
        jobs.append(stage_job(config, stream))
        sensors.append(landing_sensor(stream))
        if stream.iceberg_source:
            assets.extend(source_assets(stream))
            jobs.append(source_job(stream))
            sensors.append(source_sensor(stream))
    for router in config.routers():
        routed = config.routed_tables(router.name)
        if routed:
            assets.append(routed_tables_asset(router, routed))
            jobs.extend(
                [
                    routed_commit_job(router, routed),
                    routed_check_job(router, routed),
                    routed_freshness_job(router, routed),
                    routed_maintenance_job(router, list(routed)),
                ]
            )
            sensors.append(routed_tables_sensor(router, routed))
    for table_identifier, streams in config.tables.items():
        if any(stream.completeness for stream in streams):
            assets.append(complete_days_asset(table_identifier, streams))
        if config.router_of(table_identifier):
            continue
        assets.append(table_asset(table_identifier, streams))
        asset_checks.extend(table_checks(table_identifier, streams))
        if config.audits(table_identifier):
            assets.append(published_asset(table_identifier, streams))
            jobs.extend([publish_job(table_identifier), discard_job(table_identifier)])
        jobs.append(
            dg.define_asset_job(
                names.commit_job_name(table_identifier),
                selection=committed_assets(config, table_identifier),
                tags={names.RUN_KIND_TAG: "committer", names.PRIORITY_TAG: str(names.COMMITTER_PRIORITY)},
                description=f"Commit ready staged batches to {table_identifier}, check the commit"
                + (", and publish it when the checks pass." if config.audits(table_identifier) else "."),
            )
        )
        sensors.append(staged_batches_sensor(table_identifier, streams))
        jobs.append(maintenance_job(table_identifier))
        jobs.append(freshness_job(table_identifier))
        jobs.append(check_job(table_identifier, streams))
    return dg.Definitions(
        assets=assets,
        asset_checks=asset_checks,
        jobs=jobs,
        sensors=sensors,
        schedules=maintenance_schedules(config) + freshness_schedules(config),
        resources={"lakehouse": LakehouseResource(), "spark": SparkResource()},
        # Each run is one process with one Spark JVM: its steps (stage, commit, the checks, publish)
        # share it instead of starting a process, and a JVM, per step.
        executor=dg.in_process_executor,
    )


def committed_assets(config: LakehouseConfig, table_identifier: str) -> dg.AssetSelection:
    """What a commit to the table materializes: the table (with its checks), and under ``publish:
    audit`` its published main."""
    committed = [names.table_key(table_identifier)]
    if config.audits(table_identifier):
        committed.append(names.published_key(table_identifier))
    return dg.AssetSelection.assets(*committed)


def stage_job(config: LakehouseConfig, stream: StreamSpec):  # -> UnresolvedAssetJobDefinition, not exported
    """The writer run of one batch: stage it, then, in the same process and JVM, commit it and
    check the commit (the table's step waits for the table's commit pool, and leaves the commit
    to the committer run while ``commit_interval`` has not passed). A router only routes."""
    selection: dg.AssetSelection = dg.AssetSelection.assets(names.staged_batches_key(stream.name))
    if not stream.is_router:
        selection = selection | committed_assets(config, stream.table_identifier)
    elif routed := config.routed_tables(stream.name):
        selection = selection | routed_tables_keys(routed)
    return dg.define_asset_job(
        names.stage_job_name(stream.name),
        selection=selection,
        tags={names.RUN_KIND_TAG: "writer"},
        description=f"Stage one batch of stream {stream.name}"
        + ("." if stream.is_router else f" and commit it to {stream.table_identifier}, with its checks."),
    )


@dg.definitions
def defs() -> dg.Definitions:
    """The code location, built when Dagster loads it (importing this module reads no file): fails
    to load, naming them, when static tables are missing and may not be created (``auto_create:
    false``), as the sink RFC requires at startup."""
    lake = Lakehouse.from_env()
    require_static_tables(lake)
    return build_definitions(lake.config)
