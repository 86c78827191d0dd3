"""Named fault points for the fault-injection suite; inert unless the environment names a point.

- ``LAKEHOUSE_CRASH_AT=<point>`` kills the process there with SIGKILL, as a power cut or an OOM
  kill would, so tests can prove recovery at every step of staging and committing.
- ``LAKEHOUSE_FAIL_AT=<point>`` raises :class:`InjectedFault` there, as a catalog or storage call
  that fails would (after a commit: a commit whose outcome the caller cannot know).
- ``LAKEHOUSE_PAUSE_AT=<point>`` with ``LAKEHOUSE_PAUSE_DIR=<dir>`` creates ``<dir>/<point>.paused``
  and waits until ``<dir>/<point>.release`` exists, to hold two real processes in an interleaving.

A point a pass reaches per table is also named for one table alone, ``<point>@<table>``: a process
with several tables in flight then holds just that table's pass there. A Spark host's point is
also named for one engine function's calls, ``<point>@<function>``.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

CRASH_ENV = "LAKEHOUSE_CRASH_AT"
FAIL_ENV = "LAKEHOUSE_FAIL_AT"
PAUSE_ENV = "LAKEHOUSE_PAUSE_AT"
PAUSE_DIR_ENV = "LAKEHOUSE_PAUSE_DIR"
PAUSE_TIMEOUT_SECONDS = 300

# The writer's room checked and its attempt's directory made; nothing of the batch written yet.
WRITER_BEFORE_WRITE = "writer.before_write"
WRITER_AFTER_STAGING = "writer.after_staging_before_recording"
WRITER_AFTER_RECORDING = "writer.after_recording"
COMMITTER_BEFORE_LOCK = "committer.before_lock"
COMMITTER_BEFORE_COMMIT = "committer.before_commit"
COMMITTER_AFTER_DEAD_LETTERS = "committer.after_dead_letters_before_table"
# Around the dead letters' own write (``commit/dead_letters.py``), the fenced pass's as the table's.
DEAD_LETTERS_BEFORE_COMMIT = "dead_letters.before_commit"
DEAD_LETTERS_AFTER_WRITE = "dead_letters.after_write"
COMMITTER_AFTER_WRITE = "committer.after_write"
COMMITTER_AFTER_COMMIT = "committer.after_commit_before_bookkeeping"
# On a catalog that fences across hosts: the pass's commits are on its own branch, not yet published.
COMMITTER_BEFORE_PUBLISH = "committer.before_publish"
COMMITTER_DURING_CLEANUP = "committer.during_cleanup"
# Between reading the table to expire and recording its checkpoint (another host may maintain it).
MAINTENANCE_BEFORE_CHECKPOINT = "maintenance.before_checkpoint"
MAINTENANCE_AFTER_CHECKPOINT = "maintenance.after_checkpoint_before_expiry"
COMMITTER_AFTER_SCHEMA_CHANGE = "committer.after_schema_change_before_commit"
# Between reading the table's columns and adding the missing ones (another host may add them).
SCHEMA_BEFORE_ADD_COLUMNS = "schema.before_add_columns"
ROUTER_DURING_PUBLISH = "router.during_publish"
ROUTER_AFTER_DEAD_LETTERS = "router.after_dead_letters_before_bookkeeping"
SOURCE_AFTER_EMIT = "source.after_emit_before_checkpoint"
PUBLISH_AFTER_DEAD_LETTERS = "publish.after_dead_letters_before_fast_forward"
PUBLISH_AFTER_FAST_FORWARD = "publish.after_fast_forward"
DISCARD_AFTER_UNSTAGING = "discard.after_unstaging_before_reset"
LEDGER_AFTER_DIRECTORY = "ledger.after_directory_before_batch"
# A retained batch's directory renamed out of the ledger's sight, not deleted yet.
LEDGER_DURING_REMOVAL = "ledger.during_removal"
REPLAY_AFTER_SELECTING = "replay.after_selecting_before_landing"
# A Kafka batch's writer: its range checked against the partitions' first offsets, not read yet.
KAFKA_BEFORE_READ = "kafka.before_read"
# A change batch's row delta (``commit/row_deltas.py``): its delete files written, not committed;
# committed, the key index not updated; and the key index's own updates.
ROW_DELTA_AFTER_DELETE_FILES = "row_delta.after_delete_files_before_commit"
ROW_DELTA_AFTER_COMMIT = "row_delta.after_commit_before_index"
KEY_INDEX_DURING_REBUILD = "key_index.during_rebuild"
KEY_INDEX_BEFORE_MANIFEST = "key_index.before_manifest"
ROW_DELTA_CRASH_POINTS = (
    ROW_DELTA_AFTER_DELETE_FILES,
    ROW_DELTA_AFTER_COMMIT,
    KEY_INDEX_DURING_REBUILD,
    KEY_INDEX_BEFORE_MANIFEST,
)
# The Spark host (``engine/spark_host_server.py``): a call's work done, its answer not sent yet; named
# per engine function too (``host.before_answer@stage_batch``).
HOST_BEFORE_ANSWER = "host.before_answer"
# `lakehouse serve`: a group of requests' file written and fsynced under its temporary name; its
# idempotency keys journaled; renamed into place, the requests not answered yet.
HTTP_BEFORE_JOURNAL = "http.before_journal"
HTTP_BEFORE_RENAME = "http.before_rename"
HTTP_BEFORE_ACKNOWLEDGING = "http.before_acknowledging"
HTTP_CRASH_POINTS = (HTTP_BEFORE_JOURNAL, HTTP_BEFORE_RENAME, HTTP_BEFORE_ACKNOWLEDGING)
# The points every pipeline passes; maintenance and schema changes have their own tests.
CRASH_POINTS = (
    WRITER_AFTER_STAGING,
    WRITER_AFTER_RECORDING,
    DEAD_LETTERS_BEFORE_COMMIT,
    DEAD_LETTERS_AFTER_WRITE,
    COMMITTER_AFTER_DEAD_LETTERS,
    COMMITTER_BEFORE_COMMIT,
    COMMITTER_AFTER_WRITE,
    COMMITTER_AFTER_COMMIT,
    COMMITTER_DURING_CLEANUP,
)


class InjectedFault(RuntimeError):
    """An error raised on purpose at a fault point."""


def crash_point(name: str, subject: str | None = None) -> None:
    """Die, fail or pause here when the environment names this point; otherwise do nothing. A point
    passed on one ``subject`` (a table, an engine function) is also named for that subject alone:
    ``<point>@<subject>``."""
    named = {name} if subject is None else {name, at(name, subject)}
    if os.environ.get(CRASH_ENV) in named:
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get(FAIL_ENV) in named:
        raise InjectedFault(f"fault injected at {name}")
    if (paused := os.environ.get(PAUSE_ENV)) in named:
        directory = Path(os.environ[PAUSE_DIR_ENV])
        (directory / f"{paused}.paused").touch()
        deadline = time.monotonic() + PAUSE_TIMEOUT_SECONDS
        while not (directory / f"{paused}.release").exists() and time.monotonic() < deadline:
            time.sleep(0.1)


def at(name: str, subject: str) -> str:
    """Point ``name`` of one subject alone, as the environment names it."""
    return f"{name}@{subject}"
