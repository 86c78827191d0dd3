"""A stream's schema over its life, as a hypothesis state machine against an oracle of Iceberg's
promotion rules.

Batches whose values fit their declared types, outgrow them (a long in an ``int``, a double in a
``float``, more digits in a ``decimal(6,2)``), fit no type (text), or stop carrying a required
column, are staged one by one and committed together, interleaved with an operator widening a
column in Spark SQL and with ``lakehouse run`` processes killed (SIGKILL) after the committer's
schema change or after its write (then commit again, as the next run would). After every commit
DuckDB reads the table: every row as the oracle has it (no value lost that a legal promotion holds,
every other one NULL and counted in ``lakehouse.uncoercible-values``), and the schema equal to the
oracle's.
"""

from __future__ import annotations

import itertools
import json
import signal
import struct
from dataclasses import dataclass, field
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from lakehouse_assets import faults
from lakehouse_assets.batches.landing import land_events
from lakehouse_assets.catalog.iceberg_types import iceberg_type_name
from lakehouse_assets.catalog.table_metadata import qualified_name
from lakehouse_assets.commit import summary_keys
from lakehouse_assets.engine.spark import lakehouse_session
from lakehouse_assets.ingest.micro_batching import mint_next_batch
from lakehouse_assets.ingest.staging import stage_batch
from lakehouse_assets.ingest.table_commits import commit_table
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.quality.duck import iceberg_connection, scan
from lakehouse_assets_tests.conftest import write_config
from lakehouse_assets_tests.fault_injection.pipeline import run_pipeline

pytestmark = pytest.mark.spark

TABLE = "web.events"
STREAM = {
    "name": "events",
    "table_identifier": TABLE,
    "auto_create": True,
    "schema_evolution": {"relax_required": True},
    "schema": {
        "columns": [
            {"name": "id", "type": "long", "required": True},
            {"name": "n", "type": "int"},
            {"name": "f", "type": "float"},
            {"name": "d", "type": "decimal(6,2)"},
            {"name": "r", "type": "double", "required": True},
        ]
    },
    "commit_interval": "0s",
}
INT_RANGE = range(-(2**31), 2**31)
FLOAT_MAX = struct.unpack("f", b"\xff\xff\x7f\x7f")[0]

# Floats exact in single precision, so a value staged while the column is a float reads back whole.
N_VALUES = st.one_of(
    st.integers(-1000, 1000), st.integers(2**31, 2**62), st.integers(-(2**62), -(2**31) - 1), st.just("many")
)
F_VALUES = st.one_of(st.sampled_from([0.5, 2.25, -8.0]), st.sampled_from([1e300, -1e39]), st.just("lots"))
D_VALUES = st.one_of(
    st.decimals(min_value=-9999, max_value=9999, places=2),
    st.decimals(min_value=10**4, max_value=10**12, places=2),
    st.just("much"),
)
EVENT = st.fixed_dictionaries(
    {"n": N_VALUES, "f": F_VALUES, "d": D_VALUES}, optional={"r": st.sampled_from([1.5, 2.0])}
)


def _json(event: dict) -> str:
    """The event as a JSON line, its decimals as JSON numbers with every digit."""
    return "{" + ", ".join(f'"{k}": {v if isinstance(v, Decimal) else json.dumps(v)}' for k, v in event.items()) + "}"


def _digits(value: Decimal) -> int:
    """The decimal(P,2) precision ``value`` needs."""
    return 2 + len(str(abs(int(value))).lstrip("0") or "0")


@dataclass
class ModelTypes:
    """What the oracle says a column is: Iceberg's promotions applied when a batch needs them."""

    n: str = "int"
    f: str = "float"
    d_precision: int = 6
    r_required: bool = True

    def widened_for(self, events: list[dict]) -> ModelTypes:
        """The types a batch of ``events`` is staged in: these, promoted where its values need."""
        numbers = [e["n"] for e in events if isinstance(e["n"], int)]
        floats = [e["f"] for e in events if isinstance(e["f"], float)]
        decimals = [e["d"] for e in events if isinstance(e["d"], Decimal)]
        return ModelTypes(
            "long" if self.n == "long" or any(n not in INT_RANGE for n in numbers) else "int",
            "double" if self.f == "double" or any(abs(f) > FLOAT_MAX for f in floats) else "float",
            max([self.d_precision, *map(_digits, decimals)]),
            self.r_required and all("r" in e for e in events),
        )

    def widest(self, other: ModelTypes) -> ModelTypes:
        return ModelTypes(
            "long" if "long" in (self.n, other.n) else "int",
            "double" if "double" in (self.f, other.f) else "float",
            max(self.d_precision, other.d_precision),
            self.r_required and other.r_required,
        )

    def columns(self) -> dict[str, tuple[str, bool]]:
        return {
            "id": ("long", True),
            "n": (self.n, False),
            "f": (self.f, False),
            "d": (f"decimal({self.d_precision},2)", False),
            "r": ("double", self.r_required),
        }


@dataclass
class StagedBatch:
    types: ModelTypes
    rows: dict[int, dict] = field(default_factory=dict)


class SchemaLife(RuleBasedStateMachine):
    """One stream's table from its first batch on (a new home per example)."""

    homes = itertools.count()

    def __init__(self, work, monkeypatch) -> None:
        super().__init__()
        home = work / f"home-{next(self.homes)}"
        home.mkdir()
        monkeypatch.setenv("LAKEHOUSE_HOME", str(home / "lakehouse"))
        write_config(home, {"catalog": {"type": "hadoop"}, "streams": [STREAM]}, monkeypatch)
        self.lake = Lakehouse.from_env()
        self.spark = lakehouse_session(self.lake)
        self.ids = itertools.count(1)
        self.table_types = ModelTypes()
        self.staged: list[StagedBatch] = []
        self.committed: dict[int, tuple] = {}
        self.uncoercible: dict[str, int] = {}

    @rule(events=st.lists(EVENT, min_size=1, max_size=4))
    def stage(self, events: list[dict]) -> None:
        """A batch staged against the table as it is now (not committed yet)."""
        stream = self.lake.stream("events")
        numbered = {next(self.ids): event for event in events}
        land_events(self.lake.paths, stream, [_json({"id": i, **event}) for i, event in numbered.items()])
        batch, _ = mint_next_batch(self.lake, stream, drain=True)
        assert batch is not None
        stage_batch(self.spark, self.lake, stream, batch.sequence)
        self.staged.append(StagedBatch(self.table_types.widened_for(list(numbered.values())), numbered))

    @rule()
    def commit(self) -> None:
        """Commit what is staged, as the next run does."""
        outcome = commit_table(self.spark, self.lake, TABLE, "test")
        assert not outcome.fenced
        for batch in self.staged:
            self.table_types = self.table_types.widest(batch.types)
            for row_id, event in batch.rows.items():
                self.committed[row_id] = self._stored(event, batch.types)
        self.staged = []

    @precondition(lambda self: self.staged)
    @rule(point=st.sampled_from([faults.COMMITTER_AFTER_SCHEMA_CHANGE, faults.COMMITTER_AFTER_WRITE]))
    def killed_commit(self, point: str) -> None:
        """A ``lakehouse run`` process killed (SIGKILL) at ``point``, then the next run's commit.
        The schema change's point is reached only when a staged batch needs a wider table."""
        widened = self.table_types
        for batch in self.staged:
            widened = widened.widest(batch.types)
        reached = point == faults.COMMITTER_AFTER_WRITE or widened != self.table_types
        killed = run_pipeline({faults.CRASH_ENV: point})
        assert killed.returncode == (-signal.SIGKILL if reached else 0), killed.stdout[-3000:] + killed.stderr[-3000:]
        self.commit()

    @rule()
    def operator_widens_n(self) -> None:
        """The operator widens ``n`` by hand (Spark SQL), as a promotion would."""
        if self.lake.table(TABLE) is None or self.table_types.n == "long":
            return
        self.spark.sql(f"ALTER TABLE {qualified_name(TABLE)} ALTER COLUMN n TYPE bigint")
        self.table_types = self.table_types.widest(ModelTypes(n="long"))

    def _stored(self, event: dict, staged: ModelTypes) -> tuple:
        """The row the oracle expects: each value its column's types can hold, else NULL (counted)."""

        def kept(column: str, fits: bool):
            if not fits:
                self.uncoercible[column] = self.uncoercible.get(column, 0) + 1
                return None
            return event[column]

        f = kept("f", isinstance(event["f"], float))
        if f is not None and staged.f == "float":
            f = struct.unpack("f", struct.pack("f", f))[0]
        return (kept("n", isinstance(event["n"], int)), f, kept("d", isinstance(event["d"], Decimal)), event.get("r"))

    @invariant()
    def the_table_is_the_oracle(self) -> None:
        table = self.lake.table(TABLE)
        if table is None or table.current_snapshot() is None:
            return
        schema = {f.name: (iceberg_type_name(f.field_type), f.required) for f in table.schema().fields}
        assert schema == self.table_types.columns()
        snapshot = table.current_snapshot().snapshot_id
        query = f"SELECT id, n, f, d, r FROM {scan(self.lake.metadata_location(TABLE), snapshot)}"
        rows = {row[0]: tuple(row[1:]) for row in iceberg_connection().sql(query).fetchall()}
        assert rows == self.committed
        counted: dict[str, int] = {}
        for snapshot in table.snapshots():
            summary = snapshot.summary.additional_properties if snapshot.summary else {}
            for column, count in json.loads(summary.get(summary_keys.UNCOERCIBLE_VALUES, "{}")).items():
                counted[column] = counted.get(column, 0) + count
        assert counted == {column: count for column, count in sorted(self.uncoercible.items())}


def test_a_stream_life_of_widening_narrowing_and_missing_values_matches_the_promotion_oracle(
    tmp_path, monkeypatch, lakehouse_home
):
    """Bounded: four lives of up to eight steps (each step a Spark job or two)."""
    run_state_machine_as_test(
        lambda: SchemaLife(tmp_path, monkeypatch),
        settings=settings(
            max_examples=4,
            stateful_step_count=8,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )


def test_runs_killed_after_a_promotion_and_after_its_commit_leave_the_table_the_oracle(
    tmp_path, monkeypatch, lakehouse_home
):
    """The kills the state machine draws at random, each at least once: a batch that promotes all
    three columns and one that relaxes ``r``, each committed by a run killed at a point."""
    life = SchemaLife(tmp_path, monkeypatch)
    life.stage([{"n": 2**40, "f": 1e300, "d": Decimal("123456.78"), "r": 1.5}])
    life.killed_commit(faults.COMMITTER_AFTER_SCHEMA_CHANGE)
    life.the_table_is_the_oracle()
    life.stage([{"n": 5, "f": 0.5, "d": Decimal("1.25")}])
    life.killed_commit(faults.COMMITTER_AFTER_WRITE)
    life.the_table_is_the_oracle()
    assert life.table_types == ModelTypes("long", "double", 8, r_required=False)
