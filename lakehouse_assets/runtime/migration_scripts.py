"""Dagster's schema migration scripts, read once per process instead of for every run.

Each time Dagster opens one of its SQLite databases in a process (the runs, the schedules, the
event-log index, and with the default storage one event-log database per run), it checks the
database's schema revision, and stamps a new one, through alembic: every check and every stamp
builds a new ``ScriptDirectory``, which imports all of Dagster's migration scripts (89 files)
again: seven times in a pipeline round of two streams in one process, at least five times in a
run worker under ``dagster dev``. A run of one step takes 0.11 CPU-s instead of 0.14 when they are
read once (``docs/benchmarks.md``). Neither Dagster nor alembic offers a setting for it, so this goes around
alembic: ``ScriptDirectory.from_config`` is given a cache. The scripts a process was installed with
do not change while it runs, and a ``ScriptDirectory`` keeps what it read.
"""

from __future__ import annotations

import threading
from typing import Any

from alembic.config import Config
from alembic.script import ScriptDirectory

# What ``ScriptDirectory.from_config`` reads from a configuration, besides its version locations.
_OPTIONS = (
    "script_location",
    "file_template",
    "truncate_slug_length",
    "sourceless",
    "output_encoding",
    "timezone",
    "recursive_version_locations",
)
_lock = threading.Lock()
_directories: dict[tuple[Any, ...], ScriptDirectory] = {}
_build = ScriptDirectory.from_config


def _from_config(config: Config) -> ScriptDirectory:
    """The ``ScriptDirectory`` for ``config``'s options, built once per process."""
    options = tuple(config.get_alembic_option(name) for name in _OPTIONS)
    key = (options, tuple(config.get_version_locations_list() or ()))
    with _lock:
        if key not in _directories:
            _directories[key] = _build(config)
        return _directories[key]


def read_migration_scripts_once() -> None:
    """Make alembic build each ``ScriptDirectory`` once per process (idempotent)."""
    ScriptDirectory.from_config = staticmethod(_from_config)  # type: ignore[method-assign]
