"""The ``lakehouse`` command as a new user meets it: querying the tables with ``lakehouse sql``,
starting a project of one's own with ``lakehouse init``, and one-line errors for what a user can
get wrong."""

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from lakehouse_assets.batches.landing import land_events
from lakehouse_assets.cli import main as cli
from lakehouse_assets.cli.demo import sample_orders
from lakehouse_assets.definitions import build_definitions
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.runner import run_until_idle
from lakehouse_assets.runtime.instance_settings import LAUNCHER_MARKER, ensure_instance_settings

LAKEHOUSE = Path(sys.executable).parent / "lakehouse"


def _lakehouse(*arguments: str, cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess:
    """The installed ``lakehouse`` command, as a user runs it."""
    return subprocess.run(
        [str(LAKEHOUSE), *arguments], cwd=cwd, input=stdin, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.fixture
def two_commits(lakehouse_home, instance):
    """sales.orders after two demo rounds (20 orders, then 10), each with its broken event."""
    lake = Lakehouse.from_env()
    stream = lake.stream("orders")
    snapshots = []
    for first, count in ((1, 20), (21, 10)):
        land_events(lake.paths, stream, sample_orders(count, first_order_id=first))
        assert run_until_idle(build_definitions(lake.config), instance, log=lambda _: None).failed == []
        snapshots.append(lake.table("sales.orders").current_snapshot().snapshot_id)
    return snapshots


@pytest.mark.spark
def test_lakehouse_sql_reads_the_tables_and_the_dead_letters_by_their_iceberg_names(two_commits, tmp_path):
    first_snapshot, _ = two_commits

    table = _lakehouse("sql", "SELECT count(*) AS orders FROM sales.orders", cwd=tmp_path)
    as_json = _lakehouse("sql", "--json", "SELECT reason FROM sales.orders_dead_letters", cwd=tmp_path)
    as_csv = _lakehouse("sql", "--csv", "SELECT max(order_id) AS top FROM sales.orders", cwd=tmp_path)
    earlier = _lakehouse("sql", "--snapshot", str(first_snapshot), "SELECT count(*) FROM sales.orders", cwd=tmp_path)
    session = _lakehouse("sql", cwd=tmp_path, stdin="SELECT 1 AS one;\nSELECT count(*)\n  FROM sales.orders;\n")

    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[0].strip() == "orders" and table.stdout.splitlines()[2].strip() == "30"
    reasons = [row["reason"] for row in json.loads(as_json.stdout)]
    assert len(reasons) == 2 and all("order_id" in reason for reason in reasons), reasons
    assert list(csv.reader(io.StringIO(as_csv.stdout))) == [["top"], ["30"]]
    assert earlier.stdout.splitlines()[2].strip() == "20", earlier.stdout + earlier.stderr
    assert session.returncode == 0 and ["1", "30"] == [line.strip() for line in session.stdout.splitlines()[2::4]]


@pytest.mark.spark
def test_lakehouse_sql_names_a_missing_table_and_lists_the_known_ones_in_one_line(two_commits, tmp_path):
    missing = _lakehouse("sql", "SELECT * FROM sales.order", cwd=tmp_path)
    bad_time = _lakehouse("sql", "--at", "yesterday", "SELECT 1", cwd=tmp_path)

    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1, missing.stderr
    assert "sales.order" in missing.stderr and "tables: sales.orders, sales.orders_dead_letters" in missing.stderr
    assert bad_time.returncode == 2 and "not an ISO 8601 time: 'yesterday'" in bad_time.stderr


def test_lakehouse_ingest_of_a_missing_file_or_a_directory_is_one_line(lakehouse_home, tmp_path, capsys):
    assert cli.main(["ingest", "--stream", "orders", str(tmp_path / "nope.ndjson")]) == 2
    assert cli.main(["ingest", "--stream", "orders", str(tmp_path)]) == 2

    errors = capsys.readouterr().err.splitlines()
    assert errors == [
        f"lakehouse: cannot read {tmp_path / 'nope.ndjson'}: No such file or directory; give an NDJSON file, "
        "or - for standard input",
        f"lakehouse: cannot read {tmp_path}: Is a directory; give an NDJSON file, or - for standard input",
    ]


def test_lakehouse_init_writes_a_project_and_keeps_what_exists(tmp_path):
    project = tmp_path / "my_project"
    first = _lakehouse("init", str(project), cwd=tmp_path)
    (project / "lakehouse.yaml").write_text("streams: []\n")
    second = _lakehouse("init", str(project), cwd=tmp_path)

    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert (project / "workspace.yaml").read_text().count("lakehouse_assets.definitions") == 1
    assert LAUNCHER_MARKER in (project / ".lakehouse" / "dagster" / "dagster.yaml").read_text()
    assert (project / "lakehouse.yaml").read_text() == "streams: []\n"
    assert f"kept {project / 'lakehouse.yaml'}" in second.stdout
    assert "DAGSTER_HOME=" in first.stdout


def test_instance_settings_without_the_projects_are_reported_with_the_fix(tmp_path):
    home = tmp_path / "dagster"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")

    note = ensure_instance_settings(home)

    assert note is not None and note.startswith(f"warning: {home / 'dagster.yaml'} lacks the project's instance")
    assert "replace it with" in note and (home / "dagster.yaml").read_text() == "telemetry:\n  enabled: false\n"


def test_instance_settings_copied_before_the_run_launcher_moved_are_updated_in_place(tmp_path):
    home = tmp_path / "dagster"
    home.mkdir()
    (home / "dagster.yaml").write_text(
        "run_launcher:\n  module: lakehouse_assets.run_launcher\n  class: LivenessCheckingRunLauncher\n"
    )

    note = ensure_instance_settings(home)

    assert note == f"updated {home / 'dagster.yaml'}: the run launcher's module is now {LAUNCHER_MARKER}"
    updated = dg.DagsterInstance.from_config(str(home)).run_launcher
    assert type(updated).__name__ == "LivenessCheckingRunLauncher"
    assert ensure_instance_settings(home) is None


def test_lakehouse_demo_keep_running_without_the_object_store_is_refused_naming_both(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["demo", "--keep-running"])
    assert exit_info.value.code == 2
    assert "--keep-running keeps the servers of --object-store running" in capsys.readouterr().err
