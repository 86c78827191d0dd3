"""Every fault test starts from the same committed first round, restored from a template.

The first round runs once per test session, in a fixed directory; each test gets a fresh copy of
it in that same directory (Iceberg metadata holds absolute paths), so a test only pays for the
processes it kills and restarts. A test marked ``second_round`` (one that needs a table with some
history before its fault) starts from the first two rounds, kept as a second template beside the
first and committed once per session, instead of committing the second round itself.
"""

import shutil
from pathlib import Path

import dagster as dg
import pytest
import yaml

from lakehouse_assets.definitions import build_definitions
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.runner import run_until_idle
from lakehouse_assets_tests.fault_injection.invariants import invariant_violations
from lakehouse_assets_tests.fault_injection.pipeline import PIPELINE, land_round, run_pipeline

SECOND_ROUND_TEMPLATE = "template-second-round"


def use_home(work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``work`` (its ``lakehouse``, ``dagster`` and ``lakehouse.yaml``) the home in use."""
    monkeypatch.setenv("LAKEHOUSE_HOME", str(work / "lakehouse"))
    monkeypatch.setenv("DAGSTER_HOME", str(work / "dagster"))
    monkeypatch.setenv("LAKEHOUSE_CONFIG", str(work / "lakehouse.yaml"))


def committed_first_round(base: Path, pipeline: dict) -> Path:
    """Run ``pipeline``'s first round in ``base/work`` and keep a copy of it in ``base/template``."""
    work = base / "work"
    (work / "dagster").mkdir(parents=True)
    (work / "lakehouse.yaml").write_text(yaml.safe_dump(pipeline))
    with pytest.MonkeyPatch.context() as monkeypatch:
        use_home(work, monkeypatch)
        lake = Lakehouse.from_env()
        land_round(lake, 0)
        with dg.DagsterInstance.get() as instance:
            assert run_until_idle(build_definitions(lake.config), instance, log=lambda _: None).failed == []
        assert invariant_violations(lake) == []
    shutil.copytree(work, base / "template")
    return base


def restored_first_round(base: Path, monkeypatch: pytest.MonkeyPatch, template: str = "template") -> Path:
    """A fresh copy of the first round kept by :func:`committed_first_round` (or of another
    ``template`` kept in ``base``), in use; its home."""
    work = base / "work"
    shutil.rmtree(work)
    shutil.copytree(base / template, work)
    use_home(work, monkeypatch)
    return work / "lakehouse"


@pytest.fixture(scope="session")
def first_round_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return committed_first_round(tmp_path_factory.mktemp("fault-pipeline"), PIPELINE)


@pytest.fixture(scope="session")
def second_round_template(first_round_template: Path) -> Path:
    """The fault pipeline's first round and its second (``land_round(lake, 1)``), committed by
    ``lakehouse run --until-idle`` in this process, as the tests that start from it used to commit
    it themselves; kept beside the first round's template, in the same directory."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        restored_first_round(first_round_template, monkeypatch)
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
        return restored_first_round(base, monkeypatch, SECOND_ROUND_TEMPLATE)
    return restored_first_round(first_round_template, monkeypatch)
