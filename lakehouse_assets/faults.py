"""Named crash points for the fault-injection suite.

``crash_point(name)`` kills the current process with SIGKILL when ``LAKEHOUSE_CRASH_AT`` names that
point, exactly as a power cut or an OOM kill would, so tests can prove recovery at every step of
staging and committing with real processes. ``LAKEHOUSE_PAUSE_AT=name:seconds`` instead sleeps there,
to hold two real processes in a chosen interleaving. With neither variable set it does nothing.
"""

from __future__ import annotations

import os
import signal
import time

CRASH_ENV = "LAKEHOUSE_CRASH_AT"
PAUSE_ENV = "LAKEHOUSE_PAUSE_AT"

WRITER_AFTER_STAGING = "writer.after_staging_before_recording"
WRITER_AFTER_RECORDING = "writer.after_recording"
COMMITTER_BEFORE_LOCK = "committer.before_lock"
COMMITTER_BEFORE_COMMIT = "committer.before_commit"
COMMITTER_AFTER_DEAD_LETTERS = "committer.after_dead_letters_before_table"
COMMITTER_AFTER_COMMIT = "committer.after_commit_before_bookkeeping"
COMMITTER_DURING_CLEANUP = "committer.during_cleanup"
CRASH_POINTS = (
    WRITER_AFTER_STAGING,
    WRITER_AFTER_RECORDING,
    COMMITTER_BEFORE_COMMIT,
    COMMITTER_AFTER_DEAD_LETTERS,
    COMMITTER_AFTER_COMMIT,
    COMMITTER_DURING_CLEANUP,
)


def crash_point(name: str) -> None:
    """Die here (SIGKILL) or pause here when the environment names this point."""
    if os.environ.get(CRASH_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
    pause = os.environ.get(PAUSE_ENV, "")
    if pause.partition(":")[0] == name:
        time.sleep(float(pause.partition(":")[2] or "5"))
