"""``lakehouse init``: a project directory of one's own, outside the clone.

It writes what the pipeline and Dagster read, leaving every file that exists untouched: the
pipeline configuration (``lakehouse.yaml``, the demo's stream to start from), the Dagster workspace
(``workspace.yaml``, loading this package's definitions) and the project's instance settings in the
directory's ``.lakehouse/dagster`` (Dagster's ``DAGSTER_HOME`` for this project).
"""

from __future__ import annotations

import shlex
from importlib import resources
from pathlib import Path

from lakehouse_assets.config.loader import DEFAULT_CONFIG_FILE, DEMO_CONFIG_RESOURCE
from lakehouse_assets.paths import DEFAULT_HOME
from lakehouse_assets.runtime.instance_settings import ensure_instance_settings

WORKSPACE = """load_from:
  - python_module:
      module_name: lakehouse_assets.definitions
      location_name: lakehouse_assets
"""


def init_project(directory: Path) -> list[str]:
    """Write the project files into ``directory`` (created if needed); what it did, line by line,
    ending with how to run the project from there."""
    directory.mkdir(parents=True, exist_ok=True)
    done = []
    config = directory / DEFAULT_CONFIG_FILE
    if config.exists():
        done.append(f"kept {config}")
    else:
        config.write_text(resources.files("lakehouse_assets").joinpath(DEMO_CONFIG_RESOURCE).read_text())
        done.append(f"wrote {config} (the demo's stream: edit it for your own)")
    workspace = directory / "workspace.yaml"
    if workspace.exists():
        done.append(f"kept {workspace}")
    else:
        workspace.write_text(WORKSPACE)
        done.append(f"wrote {workspace}")
    home = (directory / DEFAULT_HOME).resolve()
    done.append(ensure_instance_settings(home / "dagster") or f"kept {home / 'dagster' / 'dagster.yaml'}")
    exports = f"export LAKEHOUSE_HOME={shlex.quote(str(home))} DAGSTER_HOME={shlex.quote(str(home / 'dagster'))}"
    done += [
        "next, from that directory:",
        f"  cd {shlex.quote(str(directory.resolve()))} && {exports}",
        "  lakehouse ingest --stream orders events.ndjson   # land events",
        "  lakehouse run --until-idle                        # or: dagster dev -w workspace.yaml",
        '  lakehouse sql "SELECT count(*) FROM sales.orders"',
    ]
    return done
