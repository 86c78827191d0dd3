"""Assemble the Dagster definitions from the pipeline configuration (loaded by ``workspace.yaml``)."""

from __future__ import annotations

import dagster as dg

from lakehouse_assets.commit.tables import require_static_tables
from lakehouse_assets.config.spec import LakehouseConfig, StreamSpec
from lakehouse_assets.defs import names
from lakehouse_assets.defs.assets import complete_days_asset, router_asset, staged_batches_asset
from lakehouse_assets.defs.checks import check_job
from lakehouse_assets.defs.commit_groups import CommitGroup, commit_groups, groups_by_table
from lakehouse_assets.defs.committer import commit_job, committer_definitions
from lakehouse_assets.defs.freshness import freshness_job, freshness_schedules
from lakehouse_assets.defs.iceberg_source import source_assets, source_job, source_sensor
from lakehouse_assets.defs.maintenance import maintenance_job, maintenance_schedules
from lakehouse_assets.defs.publishing import discard_job, publish_job, published_asset
from lakehouse_assets.defs.resources import LakehouseResource, SparkResource
from lakehouse_assets.defs.sensors import committer_sensor, landing_sensor
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.runtime.migration_scripts import read_migration_scripts_once
from lakehouse_assets.runtime.run_liveness import RUN_KIND_TAG


def build_definitions(config: LakehouseConfig) -> dg.Definitions:
    """Per stream a writer asset, job (stage, then commit) and landing sensor (and for an Iceberg
    source its change export, search export, job and polling sensor); per commit group (a table
    alone, or the tables one router feeds: ``defs.commit_groups``) one committer multi-asset, one
    step for the tables' checks, and its commit, check, freshness and maintenance jobs, sensor and schedules;
    per table under ``publish: audit`` also the published asset, publish and discard jobs."""
    read_migration_scripts_once()  # every process that runs the definitions opens Dagster's storage
    assets: list[dg.AssetsDefinition | dg.AssetSpec] = []
    asset_checks: list[dg.AssetChecksDefinition] = []
    jobs = []
    sensors: list[dg.SensorDefinition] = []
    loaded_tables = frozenset(config.tables)
    groups = commit_groups(config)
    group_of = groups_by_table(groups)
    routers_group = {group.router.name: group for group in groups if group.router}
    for stream in config.streams:
        if stream.routed_from and config.router_of(stream.table_identifier):
            continue  # staged and committed by its router's committer
        assets.append(router_asset(stream, loaded_tables) if stream.is_router else staged_batches_asset(stream))
        committed_by = routers_group.get(stream.name) if stream.is_router else group_of[stream.table_identifier]
        jobs.append(stage_job(stream, committed_by))
        sensors.append(landing_sensor(stream))
        if stream.iceberg_source:
            assets.extend(source_assets(stream))
            jobs.append(source_job(stream))
            sensors.append(source_sensor(stream))
    for group in groups:
        committer, table_checks = committer_definitions(group)
        assets.append(committer)
        asset_checks.append(table_checks)
        jobs.extend([commit_job(group), check_job(group), freshness_job(group), maintenance_job(group)])
        sensors.append(committer_sensor(group))
        for table_identifier in filter(group.audits, group.tables):
            assets.append(published_asset(table_identifier, group.tables[table_identifier]))
            jobs.extend([publish_job(table_identifier), discard_job(table_identifier)])
    for table_identifier, streams in config.tables.items():
        if any(stream.completeness for stream in streams):
            assets.append(complete_days_asset(table_identifier, streams))
    return dg.Definitions(
        assets=assets,
        asset_checks=asset_checks,
        jobs=jobs,
        sensors=sensors,
        schedules=maintenance_schedules(config, groups) + freshness_schedules(groups),
        resources={"lakehouse": LakehouseResource(), "spark": SparkResource.of(config)},
        # Each run is one process with one Spark JVM: its steps (stage, commit, the checks, publish)
        # share it instead of starting a process, and a JVM, per step.
        executor=dg.in_process_executor,
    )


def stage_job(stream: StreamSpec, group: CommitGroup | None):  # -> UnresolvedAssetJobDefinition, not exported
    """The writer run of one batch: stage it, then, in the same process and JVM, commit it and
    check the commit (the committer's step waits for its group's commit pool, and leaves the
    commit to the committer run while ``commit_interval`` has not passed). A router routes, and
    commits the tables only it feeds. ``group``: the commit group of the stream's table, or of the
    router's tables (None: a router with no table yet)."""
    selection: dg.AssetSelection = dg.AssetSelection.assets(names.staged_batches_key(stream.name))
    if group is not None:
        selection = selection | group.committed_selection()
    return dg.define_asset_job(
        names.stage_job_name(stream.name),
        selection=selection,
        tags={RUN_KIND_TAG: "writer"},
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
