"""Every fault test starts from the same committed first round, restored from a template.

The first round runs once per test session, in a fixed directory; each test gets a fresh copy of
it in that same directory (Iceberg metadata holds absolute paths), so a test only pays for the
processes it kills and restarts. A test marked ``second_round`` (one that needs a table with some
history before its fault) starts from the first two rounds, kept as a second template beside the
first and committed once per session, instead of committing the second round itself.
"""

import shutil
from pathlib import Path

import pytest

from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets_tests.fault_injection.invariants import invariant_violations
from lakehouse_assets_tests.fault_injection.pipeline import PIPELINE, land_round, run_pipeline
from lakehouse_assets_tests.fault_injection.template_homes import committed_first_round, restored_home

SECOND_ROUND_TEMPLATE = "template-second-round"


@pytest.fixture(scope="session")
def first_round_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return committed_first_round(tmp_path_factory.mktemp("fault-pipeline"), PIPELINE)


@pytest.fixture(scope="session")
def second_round_template(first_round_template: Path) -> Path:
    """The fault pipeline's first round and its second (``land_round(lake, 1)``), committed by
    ``lakehouse run --until-idle`` in this process, as the tests that start from it used to commit
    it themselves; kept beside the first round's template, in the same directory."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        restored_home(first_round_template, monkeypatch)
        lake = Lakehouse.from_env()
        land_round(lake, 1)
        completed = run_pipeline()
        assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
        assert invariant_violations(lake) == []
    shutil.copytree(first_round_template / "work", first_round_template / SECOND_ROUND_TEMPLATE)
    return first_round_template


@pytest.fixture
def lakehouse_home(request: pytest.FixtureRequest, first_round_template: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fault pipeline's home with its first round committed (overrides the root fixture), and
    its second round too for a test marked ``second_round``."""
    if request.node.get_closest_marker("second_round") is not None:
        base = request.getfixturevalue("second_round_template")
        return restored_home(base, monkeypatch, SECOND_ROUND_TEMPLATE)
    return restored_home(first_round_template, monkeypatch)
