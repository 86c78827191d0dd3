"""Commit groups: the tables one committer commits, and the names of their Dagster objects.

Every table is committed by its group's one multi-asset, job and sensor (``defs.committer``). A
table written only by one router (and published directly) is in that router's group with every
other such table, so a database of 500 tables is one sensor and one run per cycle; any other table
is a group of one. The group is a parameter, not a second pipeline: it decides the names, where a
table's batches come from (its writer runs stage them, or the committer stages the router's
route files itself) and the run's tags. Nothing else differs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import dagster as dg

from lakehouse_assets.config.spec import LakehouseConfig, StreamSpec
from lakehouse_assets.defs import names


@dataclass(frozen=True)
class CommitGroup:
    """The tables one committer commits, each with the streams that write it; ``router`` is the
    stream whose route files feed them all (None for a group of one table with writers of its own)."""

    tables: dict[str, list[StreamSpec]]
    router: StreamSpec | None = None
    audited: frozenset[str] = frozenset()
    """The tables whose commits await publishing (``publish: audit``; never a router's)."""

    def _named(self, of_table: Callable[[str], str], of_router: str) -> str:
        """A table alone keeps its table's name; a router's group is named ``of_router`` with
        ``{}`` the router's name."""
        return of_router.format(self.router.name) if self.router else of_table(self.only_table)

    @property
    def only_table(self) -> str:
        """The table of a group of one."""
        [table] = self.tables
        return table

    @property
    def label(self) -> str:
        """How messages name the group."""
        return self._named(lambda table: table, "the tables stream {} routes to")

    @property
    def op_name(self) -> str:
        """The committer's op (a table alone keeps the name of its asset's op)."""
        return self._named(lambda table: names.table_key(table).to_python_identifier(), "{}_routed_tables")

    @property
    def checks_op_name(self) -> str:
        """The op of the tables' checks when a run has a step for them (``defs.committer.committer_definitions``)."""
        return f"{self.op_name}_checks"

    @property
    def commit_job_name(self) -> str:
        return self._named(names.commit_job_name, "{}_routed_commit_job")

    @property
    def sensor_name(self) -> str:
        return self._named(names.staged_sensor_name, "{}_routed_tables_sensor")

    @property
    def pool(self) -> str:
        """The concurrency pool of the committer step: one step commits the whole group."""
        return self._named(names.commit_pool, "iceberg_commit/routed/{}")

    @property
    def check_job_name(self) -> str:
        return self._named(names.check_job_name, "{}_routed_check_job")

    @property
    def freshness_job_name(self) -> str:
        return self._named(names.freshness_job_name, "{}_routed_freshness_job")

    @property
    def freshness_schedule_name(self) -> str:
        return self._named(names.freshness_schedule_name, "{}_routed_freshness_schedule")

    @property
    def maintenance_job_name(self) -> str:
        return self._named(names.maintenance_job_name, "{}_routed_maintenance_job")

    @property
    def maintenance_op_name(self) -> str:
        return self._named(names.maintenance_op_name, "maintain_{}_routed_tables")

    @property
    def maintenance_schedule_name(self) -> str:
        return self._named(names.maintenance_schedule_name, "{}_routed_maintenance_schedule")

    @property
    def writer_job_names(self) -> list[str]:
        """The jobs whose runs stage batches for the group and commit them when they may."""
        if self.router:
            return [names.stage_job_name(self.router.name)]
        return [names.stage_job_name(stream.name) for stream in self.tables[self.only_table]]

    def upstream_keys(self, table: str) -> list[dg.AssetKey]:
        """What a table's asset is made from: its streams' staged batches, or its router's."""
        streams = [self.router] if self.router else self.tables[table]
        return [names.staged_batches_key(stream.name) for stream in streams]

    def audits(self, table: str) -> bool:
        return table in self.audited

    def committed_keys(self, tables: list[str]) -> list[dg.AssetKey]:
        """What committing ``tables`` materializes: each table, and an audited table's published main."""
        keys = []
        for table in tables:
            keys.append(names.table_key(table))
            if self.audits(table):
                keys.append(names.published_key(table))
        return keys

    def committed_selection(self) -> dg.AssetSelection:
        """Every table of the group (and published main) without their checks: a committing run
        evaluates the checks of what it committed itself, on the snapshot it committed."""
        return dg.AssetSelection.assets(*self.committed_keys(list(self.tables))).without_checks()

    def run_tags(self, tables: list[str]) -> dict[str, str]:
        """The tags of a committer run for ``tables``."""
        if self.router:
            return {names.STREAM_TAG: self.router.name, "lakehouse/tables": str(len(tables))}
        return {names.TABLE_TAG: self.only_table}


def commit_groups(config: LakehouseConfig) -> list[CommitGroup]:
    """The configuration's tables by committer: one group per router for the tables only it
    feeds (``LakehouseConfig.router_of``), one group per other table."""
    groups = [
        CommitGroup(routed, router) for router in config.routers() if (routed := config.routed_tables(router.name))
    ]
    for table, streams in config.tables.items():
        if config.router_of(table) is None:
            groups.append(CommitGroup({table: streams}, audited=frozenset([table] if config.audits(table) else [])))
    return groups


def groups_by_table(groups: list[CommitGroup]) -> dict[str, CommitGroup]:
    """The group that commits each table."""
    return {table: group for group in groups for table in group.tables}
