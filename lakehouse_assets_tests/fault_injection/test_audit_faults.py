"""Write-audit-publish under failure: pipeline processes with ``publish: audit`` killed between the
audit commit, the dead letters and the fast-forward of main, and a discard killed half-way; then
restarted, with the invariant checker reading main against the landing oracle."""

import json
import signal
from pathlib import Path

import pytest
import yaml

from lakehouse_assets import faults
from lakehouse_assets.batches.landing import land_events
from lakehouse_assets.commit.branches import audit_state
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets_tests.fault_injection.invariants import invariant_violations
from lakehouse_assets_tests.fault_injection.pipeline import (
    PIPELINE,
    kill_at_then_restart,
    land_round,
    run_lakehouse,
    run_pipeline,
)
from lakehouse_assets_tests.fault_injection.template_homes import committed_first_round, restored_home

pytestmark = pytest.mark.spark

AMOUNT_LIMIT = {"name": "amount_below_limit", "condition": "amount < 1000"}
TABLES = ("sales.orders", "crm.customers")
PUBLISH_POINTS = (
    faults.COMMITTER_AFTER_COMMIT,
    faults.PUBLISH_AFTER_DEAD_LETTERS,
    faults.PUBLISH_AFTER_FAST_FORWARD,
)


def _audited_pipeline(limit: dict) -> dict:
    streams = [{**stream, "publish": "audit"} for stream in PIPELINE["streams"]]
    streams[0] = {**streams[0], "expectations": [limit]}
    return {"streams": streams}


@pytest.fixture(scope="module")
def audited_round_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return committed_first_round(tmp_path_factory.mktemp("audited-pipeline"), _audited_pipeline(AMOUNT_LIMIT))


@pytest.fixture
def lakehouse_home(audited_round_template: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The audited pipeline's home with its first round published (overrides the root fixture)."""
    return restored_home(audited_round_template, monkeypatch)


def _branches_agree(lake) -> bool:
    """Nothing is left on an audit branch that main does not have."""
    return not any(audit_state(lake.table(table)).awaiting_publish for table in TABLES)


@pytest.mark.parametrize("point", PUBLISH_POINTS)
def test_an_audited_pipeline_killed_before_or_while_publishing_publishes_exactly_once(point, lake):
    land_round(lake, 1)

    kill_at_then_restart(point, cold=point == PUBLISH_POINTS[0])

    assert invariant_violations(lake) == []
    assert _branches_agree(lake)


def test_a_discard_killed_half_way_finishes_when_repeated_and_the_batch_publishes_once(lake, lakehouse_home):
    land_round(lake, 1)
    land_events(
        lake.paths, lake.stream("orders"), [json.dumps({"order_id": 10_000, "customer_id": 1, "amount": 5000.0})]
    )
    blocked = run_pipeline()
    assert blocked.returncode == 1, blocked.stdout[-3000:]
    assert audit_state(lake.table("sales.orders")).awaiting_publish

    crashed = run_lakehouse(
        ["audit", "discard", "--table", "sales.orders"], {faults.CRASH_ENV: faults.DISCARD_AFTER_UNSTAGING}
    )
    assert crashed.returncode == -signal.SIGKILL
    repeated = run_lakehouse(["audit", "discard", "--table", "sales.orders"])
    assert repeated.returncode == 0, repeated.stdout[-3000:] + repeated.stderr[-3000:]
    assert "discarded audited snapshot" in repeated.stdout

    # The fix: the limit was wrong. The discarded batch is staged again and published once.
    (lakehouse_home.parent / "lakehouse.yaml").write_text(
        yaml.safe_dump(_audited_pipeline({**AMOUNT_LIMIT, "condition": "amount < 10000"}))
    )
    restarted = run_pipeline()
    assert restarted.returncode == 0, restarted.stdout[-3000:] + restarted.stderr[-3000:]

    lake = Lakehouse.from_env()
    assert invariant_violations(lake) == []
    assert _branches_agree(lake)


def test_a_discard_after_a_publish_killed_past_its_dead_letters_is_refused_and_the_publish_finishes(lake):
    land_round(lake, 1)
    crashed = run_pipeline({faults.CRASH_ENV: faults.PUBLISH_AFTER_DEAD_LETTERS})
    assert crashed.returncode == -signal.SIGKILL, crashed.stdout[-3000:]

    # Discarding now would leave the round's dead letters in the table for batches staged again.
    [halted] = [table for table in TABLES if audit_state(lake.table(table)).awaiting_publish]
    refused = run_lakehouse(["audit", "discard", "--table", halted])
    assert refused.returncode == 1, refused.stdout[-3000:] + refused.stderr[-3000:]
    assert "committed their dead letters and did not finish" in refused.stdout
    assert audit_state(lake.table(halted)).awaiting_publish

    restarted = run_pipeline()
    assert restarted.returncode == 0, restarted.stdout[-3000:] + restarted.stderr[-3000:]
    assert invariant_violations(lake) == []
    assert _branches_agree(lake)
