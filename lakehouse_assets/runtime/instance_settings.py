"""The project's Dagster instance settings (``dagster.yaml``) in whatever ``DAGSTER_HOME`` is used.

Dagster reads its instance settings only from ``$DAGSTER_HOME/dagster.yaml`` and silently falls back
to defaults without it: no run queue, no commit pools, no run retries, no run monitoring. So every
entry point puts the project's settings (shipped in the package) there when it has none, and says so
when the file there lacks them (and names the run launcher's module where it is now).
``python -m lakehouse_assets.runtime.instance_settings`` does it for ``make ui``.
"""

from __future__ import annotations

import os
import shutil
import sys
from importlib import resources
from pathlib import Path

from lakehouse_assets.paths import DAGSTER_HOME_ENV, LakehousePaths

SETTINGS_FILE = "dagster.yaml"
LAUNCHER_MARKER = "lakehouse_assets.runtime.run_launcher"
"""Text every copy of the project's settings holds: its run launcher."""
MOVED_LAUNCHER = "module: lakehouse_assets.run_launcher\n"
"""The run launcher's module before it moved into ``runtime``, in settings copied before then."""


def project_settings() -> Path:
    """The project's ``dagster.yaml``, as the package ships it."""
    return Path(str(resources.files("lakehouse_assets").joinpath(SETTINGS_FILE)))


def dagster_home(paths: LakehousePaths) -> Path:
    """``$DAGSTER_HOME``, by default ``$LAKEHOUSE_HOME/dagster`` (set in this process's environment)."""
    return Path(os.environ.setdefault(DAGSTER_HOME_ENV, str(paths.dagster_home)))


def ensure_instance_settings(home: Path) -> str | None:
    """Copy the project's settings into ``home`` when it has none; a note for the user when it
    copied them or when the file there lacks them, else None."""
    target = home / SETTINGS_FILE
    home.mkdir(parents=True, exist_ok=True)
    if not target.exists():
        shutil.copy(project_settings(), target)
        return f"wrote the project's Dagster instance settings to {target}"
    settings = target.read_text(errors="replace")
    if MOVED_LAUNCHER in settings:  # Dagster could not load the launcher from its old module
        target.write_text(settings.replace(MOVED_LAUNCHER, f"module: {LAUNCHER_MARKER}\n"))
        return f"updated {target}: the run launcher's module is now {LAUNCHER_MARKER}"
    if LAUNCHER_MARKER not in settings:
        return (
            f"warning: {target} lacks the project's instance settings (run launcher and monitoring, commit "
            f"pools, run queue); replace it with {project_settings()}, or merge that file into it"
        )
    return None


def main() -> None:
    """Ensure the settings in ``$DAGSTER_HOME`` (or the home's default) and print any note."""
    note = ensure_instance_settings(dagster_home(LakehousePaths.from_env()))
    if note:
        print(note, file=sys.stderr)


if __name__ == "__main__":
    main()
