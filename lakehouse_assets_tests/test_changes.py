"""Row-level changes through the real pipeline, compared with a Python model of the table.

Seeded random CDC streams insert, update and delete a small key space within and across batches,
repeat events, re-insert deleted keys and include events that must be dead-lettered; the result is
read back with DuckDB and must equal the model, on format v2 (position deletes) and v3 (deletion
vectors), for plain events with an operation field and for Debezium envelopes.
"""

import json
import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

import dagster as dg
import pytest

from lakehouse_assets.batches.landing import land_events
from lakehouse_assets.commit import summary_keys
from lakehouse_assets.commit.recovery import lakehouse_commits
from lakehouse_assets.definitions import build_definitions
from lakehouse_assets.defs import names
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.quality.duck import iceberg_connection, scan
from lakehouse_assets.runner import run_until_idle
from lakehouse_assets_tests.conftest import write_config

pytestmark = pytest.mark.spark

EPOCH = datetime(2026, 11, 1, tzinfo=timezone.utc)
PLAIN_OPERATIONS = {"INSERT": ["c", "insert", "Create", "i"], "UPDATE": ["u", "UPDATE"], "DELETE": ["d", "delete"]}


def customers_stream(format_version: str, landing_format: str) -> dict:
    stream = {
        "name": "customers",
        "source": {"landing": {"format": landing_format}},
        "table_identifier": "crm.customers",
        "auto_create": True,
        "identifier_columns": ["id"],
        "schema": {
            "columns": [
                {"name": "id", "type": "long", "required": True},
                {"name": "name", "type": "string"},
                {"name": "amount", "type": "double"},
                {"name": "ts", "type": "timestamptz"},
            ],
            "partition_spec": [{"column": "id", "transform": "bucket[4]"}],
        },
        "table_properties": {"format-version": format_version},
        "flush": {"max_bytes": 1, "max_age": "60s"},
        "commit_interval": "0s",
    }
    if landing_format == "json":
        stream["operation"] = "${/op}"
    return stream


@dataclass
class TableModel:
    """The expected table: the last upserted row per key, deletes removing the key."""

    rows: dict[int, tuple] = field(default_factory=dict)

    def apply(self, operation: str, row: dict) -> None:
        if operation == "DELETE":
            self.rows.pop(row["id"], None)
        else:
            self.rows[row["id"]] = (row["id"], row.get("name"), row.get("amount"), row.get("ts_ms"))


@dataclass
class ChangeGenerator:
    """Random changes to keys 0..key_space-1, rendered as plain events or Debezium envelopes."""

    seed: int
    landing_format: str
    key_space: int = 25
    position: int = 0
    model: TableModel = field(default_factory=TableModel)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def _row(self, key: int) -> dict:
        ts = EPOCH + timedelta(seconds=self.rng.randint(0, 86400 * 30))
        return {
            "id": key,
            "name": self.rng.choice(["ada", "grace", "edsger", None, "barbara"]),
            "amount": round(self.rng.uniform(0, 100), 2),
            "ts_ms": int(ts.timestamp() * 1000),
        }

    def _render(self, operation: str, row: dict, before: dict | None) -> str:
        self.position += 1
        visible = {"id": row["id"], "name": row["name"], "amount": row["amount"], "ts": row["ts_ms"]}
        if self.landing_format == "json":
            return json.dumps({"op": self.rng.choice(PLAIN_OPERATIONS[operation]), **visible})
        code = {"INSERT": self.rng.choice(["c", "r"]), "UPDATE": "u", "DELETE": "d"}[operation]
        before_row = None if before is None else {**before, "ts": before.get("ts_ms")}
        envelope = {
            "before": before_row if operation != "INSERT" else None,
            "after": visible if operation != "DELETE" else None,
            "op": code,
            "source": {"connector": "postgresql", "lsn": 1000 + self.position},
            "ts_ms": 1764000000000 + self.position,
        }
        if operation == "DELETE":
            envelope["before"] = {"id": row["id"], "name": None, "amount": None, "ts": None}
        return json.dumps(envelope)

    def batch(self, size: int) -> list[str]:
        lines = []
        for _ in range(size):
            key = self.rng.randrange(self.key_space)
            exists = key in self.model.rows
            operation = self.rng.choices(["INSERT", "UPDATE", "DELETE"], weights=[4, 4, 3] if exists else [6, 2, 2])[0]
            row = self._row(key)
            before = (
                None if not exists else dict(zip(("id", "name", "amount", "ts_ms"), self.model.rows[key], strict=True))
            )
            line = self._render(operation, row, before)
            self.model.apply(operation, row)
            lines.append(line)
            if self.rng.random() < 0.1:  # a duplicated delivery of the same change
                lines.append(line)
        if self.landing_format == "debezium":
            # Debezium order comes from the source position (LSN), not from the line order.
            self.rng.shuffle(lines)
        return lines


def _table_rows(lake):
    table = lake.table("crm.customers")
    location = lake.metadata_location("crm.customers")
    query = (
        f"SELECT id, name, amount, epoch_ms(ts) FROM {scan(location, table.current_snapshot().snapshot_id)} ORDER BY id"
    )
    return iceberg_connection().sql(query).fetchall()


# Each landing format and each table format once (pairwise): the formats are read before the
# batch is applied, the table's format decides only how (a row delta on v2, a MERGE on v3).
@pytest.mark.parametrize(("landing_format", "format_version"), [("json", "2"), ("debezium", "3")])
def test_random_change_streams_produce_exactly_the_model(
    landing_format, format_version, lakehouse_home, paths, instance, tmp_path, monkeypatch
):
    write_config(tmp_path, {"streams": [customers_stream(format_version, landing_format)]}, monkeypatch)
    lake = Lakehouse.from_env()
    stream = lake.stream("customers")
    defs = build_definitions(lake.config)
    generator = ChangeGenerator(seed=int(format_version) * 10 + len(landing_format), landing_format=landing_format)
    bad_events = (
        [json.dumps({"op": "truncate", "id": 1})]
        if landing_format == "json"
        else [json.dumps({"op": "u", "before": None, "after": None, "source": {"lsn": 1}})]
    )

    for round_number in range(3):
        for _ in range(2):
            land_events(paths, stream, generator.batch(40))
        if round_number == 1:
            land_events(paths, stream, bad_events)
        report = run_until_idle(defs, instance, log=lambda _: None)
        assert report.failed == []
        assert _table_rows(lake) == sorted(generator.model.rows.values())

    table = lake.table("crm.customers")
    commits = lakehouse_commits(table)
    assert [(c.first_sequence, c.last_sequence) for c in commits] == [(n, n) for n in range(1, 8)]
    merges = [s.summary.additional_properties for s in table.snapshots() if s.summary.operation.value == "overwrite"]
    assert merges, "later batches must commit with deletes (overwrite snapshots: row deltas on v2, MERGE on v3)"
    delete_kind = "added-dvs" if format_version == "3" else "added-position-delete-files"
    assert any(int(summary.get(delete_kind, "0")) > 0 for summary in merges)
    assert all(summary_keys.INSERTED in summary for summary in merges)

    dead_letter_table = "crm.customers_dead_letters"
    dead = (
        iceberg_connection()
        .sql(f"SELECT reason FROM iceberg_scan('{lake.metadata_location(dead_letter_table)}')")
        .fetchall()
    )
    expected_reason = (
        "unrecognized operation 'truncate'" if landing_format == "json" else ("Debezium change without an 'after' row")
    )
    assert dead == [(expected_reason,)]

    table_key = names.table_key("crm.customers")
    for check_name in names.CHECK_NAMES + names.CHANGE_CHECK_NAMES:
        record = instance.get_latest_asset_check_evaluation_record(dg.AssetCheckKey(table_key, check_name))
        assert record.status.value == "SUCCEEDED", (check_name, record.event.dagster_event.event_specific_data)
    metadata = instance.get_latest_materialization_event(table_key).asset_materialization.metadata
    assert {"rows_inserted", "rows_updated", "rows_deleted"} <= set(metadata)


def test_change_checks_fail_on_duplicated_keys_and_on_a_batch_not_applied(
    lakehouse_home, paths, instance, tmp_path, monkeypatch
):
    from lakehouse_assets.batches.ledger import StreamLedger
    from lakehouse_assets.engine.spark import lakehouse_session
    from lakehouse_assets.quality import checks

    write_config(tmp_path, {"streams": [customers_stream("2", "json")]}, monkeypatch)
    lake = Lakehouse.from_env()
    stream = lake.stream("customers")
    land_events(paths, stream, [json.dumps({"op": "c", "id": key, "name": "a"}) for key in range(5)])
    land_events(paths, stream, [json.dumps({"op": "d", "id": 1}), json.dumps({"op": "u", "id": 2, "name": "b"})])
    assert run_until_idle(build_definitions(lake.config), instance, log=lambda _: None).failed == []
    table = lake.table("crm.customers")
    location = lake.metadata_location("crm.customers")
    merge_snapshot = table.current_snapshot()
    batch = StreamLedger(paths.staging("customers")).batch(2)
    columns = ["id", "name", "amount", "ts"]
    connection = iceberg_connection()

    applied = checks.check_changes_applied(
        connection,
        location,
        [checks.CommittedChanges(2, merge_snapshot.snapshot_id, str(batch.events_path()))],
        ["id"],
        columns,
    )
    assert applied.passed, applied.description
    not_applied = checks.check_changes_applied(
        connection,
        location,
        [checks.CommittedChanges(2, merge_snapshot.parent_snapshot_id, str(batch.events_path()))],
        ["id"],
        columns,
    )
    assert not not_applied.passed
    assert "batch 2: 1 deleted keys are still present" in not_applied.description
    assert "batch 2: 1 upserted keys are missing or hold other values" in not_applied.description

    lakehouse_session(lake).sql("INSERT INTO lake.crm.customers VALUES (3, 'twin', NULL, NULL)")
    duplicated = lake.table("crm.customers").current_snapshot().snapshot_id
    location = lake.metadata_location("crm.customers")
    outcome = checks.check_keys_unique(connection, checks.CommittedSnapshot(location, duplicated), ["id"])
    assert not outcome.passed and outcome.metadata["duplicated_keys"] == ["(3,)"]


def test_replaying_a_change_batch_leaves_the_same_table(lakehouse_home, paths, instance, tmp_path, monkeypatch):
    from pyspark.sql import functions as F

    from lakehouse_assets.batches.ledger import StreamLedger
    from lakehouse_assets.batches.staged_rows import accepted_rows
    from lakehouse_assets.commit.table_writes import merge_changes
    from lakehouse_assets.engine.spark import lakehouse_session

    write_config(tmp_path, {"streams": [customers_stream("2", "json")]}, monkeypatch)
    lake = Lakehouse.from_env()
    stream = lake.stream("customers")
    generator = ChangeGenerator(seed=5, landing_format="json")
    land_events(paths, stream, generator.batch(60))
    assert run_until_idle(build_definitions(lake.config), instance, log=lambda _: None).failed == []
    before = _table_rows(lake)

    spark = lakehouse_session(lake)
    batch = StreamLedger(paths.staging("customers")).batch(1)
    table_schema = spark.table("lake.crm.customers").schema
    columns = table_schema.fieldNames()
    changes = accepted_rows(spark.read.parquet(str(batch.events_path())), table_schema)
    assert changes.groupBy("id").count().where(F.col("count") > 1).count() == 0
    merge_changes(spark, "crm.customers", changes, ["id"], columns, {}, "replayed_batch")

    assert _table_rows(lake) == before == sorted(generator.model.rows.values())


REGIONS = ["eu", "it's", 'say "hi"', "back\\slash", "日本", "", "a,b;c", "NULL"]


def test_composite_keys_with_any_strings_apply_through_the_key_index(
    lakehouse_home, paths, instance, tmp_path, monkeypatch
):
    """Keys named like the lookup's own columns and the reader's (``file``, ``pos``, ``filename``)
    and strings of any kind stay values, never SQL or column clashes."""
    stream = {
        **customers_stream("2", "json"),
        "identifier_columns": ["file", "pos"],
        "schema": {
            "columns": [
                {"name": "file", "type": "string", "required": True},
                {"name": "pos", "type": "long", "required": True},
                {"name": "filename", "type": "string"},
            ]
        },
    }
    write_config(tmp_path, {"streams": [stream]}, monkeypatch)
    lake = Lakehouse.from_env()
    defs = build_definitions(lake.config)
    rng = random.Random(5)
    model: dict[tuple, str | None] = {}
    for round_number in range(3):
        lines = []
        for _ in range(60):
            key = (rng.choice(REGIONS), rng.randrange(4))
            if key in model and rng.random() < 0.3:
                model.pop(key)
                lines.append(json.dumps({"op": "d", "file": key[0], "pos": key[1]}))
            else:
                model[key] = f"r{round_number}-{rng.randrange(1000)}"
                lines.append(json.dumps({"op": "u", "file": key[0], "pos": key[1], "filename": model[key]}))
        land_events(paths, lake.stream("customers"), lines)
        assert run_until_idle(defs, instance, log=lambda _: None).failed == []
        table = lake.table("crm.customers")
        query = f"SELECT file, pos, filename FROM {scan(table.metadata_location, table.current_snapshot().snapshot_id)}"
        assert sorted(iceberg_connection().sql(query).fetchall()) == sorted((*k, v) for k, v in model.items())
    metadata = instance.get_latest_materialization_event(names.table_key("crm.customers")).asset_materialization
    assert metadata.metadata["commit_kind"].value == "row_delta"
