"""Homes kept as templates for the fault tests: a pipeline's committed first round, made once in a
fixed directory and restored there for each test (Iceberg's metadata holds absolute paths)."""

import shutil
from pathlib import Path

import dagster as dg
import pytest
import yaml

from lakehouse_assets.definitions import build_definitions
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.runner import run_until_idle
from lakehouse_assets_tests.fault_injection.invariants import invariant_violations
from lakehouse_assets_tests.fault_injection.pipeline import land_round

FIRST_ROUND_TEMPLATE = "template"


def use_home(work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``work`` (its ``lakehouse``, ``dagster`` and ``lakehouse.yaml``) the home in use."""
    monkeypatch.setenv("LAKEHOUSE_HOME", str(work / "lakehouse"))
    monkeypatch.setenv("DAGSTER_HOME", str(work / "dagster"))
    monkeypatch.setenv("LAKEHOUSE_CONFIG", str(work / "lakehouse.yaml"))


def committed_first_round(base: Path, pipeline: dict) -> Path:
    """Run ``pipeline``'s first round in ``base/work`` and keep a copy of it in ``base/template``
    (``FIRST_ROUND_TEMPLATE``)."""
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
    shutil.copytree(work, base / FIRST_ROUND_TEMPLATE)
    return base


def restored_home(base: Path, monkeypatch: pytest.MonkeyPatch, template: str = FIRST_ROUND_TEMPLATE) -> Path:
    """A fresh copy of a home kept in ``base`` (by default the first round of
    :func:`committed_first_round`), restored in ``base/work`` and in use; its ``lakehouse``."""
    work = base / "work"
    shutil.rmtree(work)
    shutil.copytree(base / template, work)
    use_home(work, monkeypatch)
    return work / "lakehouse"
