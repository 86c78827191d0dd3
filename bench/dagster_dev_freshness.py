"""Freshness of the pipeline where users run it: under ``dagster dev`` (webserver + daemon), each run
its own process, events landed through ``lakehouse ingest`` at a fixed rate.

    python bench/dagster_dev_freshness.py --rate 5000 --seconds 120

In a temporary directory (own ``LAKEHOUSE_HOME``, ``DAGSTER_HOME`` and ``LAKEHOUSE_CONFIG`` with one
append stream ``bench_events`` -> ``bench.events``) it starts ``dagster dev``, waits until the code
location is loaded and the daemon ticks the landing sensor, then lands one chunk of
``rate * chunk_seconds`` events every ``--chunk-seconds`` with ``lakehouse ingest --stream
bench_events -``. A thread reads the table's committed ``total-records`` every second with PyIceberg
(no JVM); a chunk is visible at the first poll that counts all events through it, and its freshness
is visible time minus the time ``lakehouse ingest`` returned. After the last chunk it waits until
everything is committed and no run is in progress, stops ``dagster dev`` (and any process it left),
checks with DuckDB that every event is in the table exactly once and reads the Dagster instance to
show where a batch's time goes: queueing, run process start, steps, materializations and checks.

Exit code 1 when an event is missing or duplicated, a run failed, or draining timed out. The raw
per-chunk data and the summary go to ``<tmp>/result.json`` (and ``--json-out``). Without ``--keep``
only ``result.json`` and the ``dagster dev`` log stay in the temporary directory after a clean run.
The machine this was written on has 2 cores; ``dagster.yaml`` allows 2 concurrent runs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

STREAM = "bench_events"
TABLE = "bench.events"
TABLE_ASSET = "bench/events"
STAGING_ASSET = f"staging/{STREAM}_batches"
LANDING_SENSOR = f"{STREAM}_landing_sensor"
STAGE_JOB = f"{STREAM}_stage_job"
SEQUENCE_TAG = "lakehouse/sequence"
STATUSES = ("created", "paid", "shipped", "cancelled")
PROJECT_ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

WORKSPACE_QUERY = """
query Workspace {
  workspaceOrError {
    __typename
    ... on Workspace {
      locationEntries {
        name
        loadStatus
        locationOrLoadError {
          __typename
          ... on RepositoryLocation { repositories { name } }
          ... on PythonError { message }
        }
      }
    }
    ... on PythonError { message }
  }
}
"""

SENSOR_QUERY = """
query Sensor($selector: SensorSelector!) {
  sensorOrError(sensorSelector: $selector) {
    __typename
    ... on Sensor { sensorState { status ticks(limit: 1) { status timestamp skipReason error { message } } } }
    ... on PythonError { message }
    ... on SensorNotFoundError { message }
  }
}
"""

FAILED_TICKS_QUERY = """
query FailedTicks($repository: RepositorySelector!) {
  sensorsOrError(repositorySelector: $repository) {
    __typename
    ... on Sensors {
      results { name sensorState { ticks(statuses: [FAILURE], limit: 3) { timestamp error { message } } } }
    }
  }
}
"""


class GraphQLError(RuntimeError):
    """The webserver answered a GraphQL query with errors (retried while starting up)."""


@dataclass
class Workdir:
    """The temporary directory of one benchmark and the environment every process gets."""

    root: Path
    home: Path
    dagster_home: Path
    config_file: Path
    log_file: Path
    env: dict[str, str]


@dataclass
class Location:
    """The loaded code location and repository names, as the webserver reports them."""

    location: str
    repository: str


@dataclass
class Chunk:
    """One ``lakehouse ingest`` call and when its events became visible in the table."""

    index: int
    first_event_id: int
    last_event_id: int
    events: int
    cumulative_events: int
    scheduled_at: float
    started_at: float
    landed_at: float
    ingest_seconds: float
    late_start_seconds: float
    overran: bool
    landing_files: list[str] = field(default_factory=list)
    visible_at: float | None = None
    freshness_seconds: float | None = None
    committed_by: str | None = None
    path: dict[str, float | None] = field(default_factory=dict)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=int, default=5000, help="events per second (default 5000)")
    parser.add_argument("--seconds", type=float, default=120, help="how long to produce (default 120)")
    parser.add_argument("--chunk-seconds", type=float, default=5, help="one ingest every N seconds (default 5)")
    parser.add_argument("--max-age", default="15s", help="the stream's flush.max_age (default 15s)")
    parser.add_argument("--drain-timeout", type=float, default=300, help="seconds to wait for the last commit")
    parser.add_argument("--startup-timeout", type=float, default=300, help="seconds to wait for dagster dev")
    parser.add_argument("--port", type=int, default=None, help="webserver port (default: a free port)")
    parser.add_argument("--keep", action="store_true", help="keep the whole temporary directory")
    parser.add_argument("--project-root", type=Path, default=PROJECT_ROOT, help="where workspace.yaml is")
    parser.add_argument("--json-out", type=Path, default=None, help="also write the result JSON here")
    args = parser.parse_args(argv)
    if args.rate <= 0 or args.seconds <= 0 or args.chunk_seconds <= 0:
        parser.error("--rate, --seconds and --chunk-seconds must be positive")
    return args


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def stream_config(max_age: str) -> dict[str, Any]:
    """The benchmark's configuration: one append stream with a day-partitioned table."""
    stream = {
        "name": STREAM,
        "table_identifier": TABLE,
        "auto_create": True,
        "schema": {
            "columns": [
                {"name": "event_id", "type": "long", "required": True},
                {"name": "customer_id", "type": "long"},
                {"name": "amount", "type": "double"},
                {"name": "status", "type": "string"},
                {"name": "ts", "type": "timestamptz"},
            ],
            "partition_spec": [{"column": "ts", "transform": "day"}],
        },
        "table_properties": {"format-version": "2"},
        "flush": {"max_bytes": 67108864, "max_age": max_age},
        "commit_interval": "0s",
        "maintenance": {"schedule": None},
    }
    return {"streams": [stream]}


def make_workdir(args: argparse.Namespace) -> Workdir:
    """Create the temporary homes and config, and point this process's environment at them."""
    root = Path(tempfile.mkdtemp(prefix="lakehouse-dev-freshness-"))
    home, dagster_home = root / "home", root / "dagster"
    home.mkdir()
    dagster_home.mkdir()
    shutil.copy(args.project_root / "dagster.yaml", dagster_home / "dagster.yaml")
    config_file = root / "lakehouse.yaml"
    config_file.write_text(yaml.safe_dump(stream_config(args.max_age), sort_keys=False))
    settings = {
        "LAKEHOUSE_HOME": str(home),
        "DAGSTER_HOME": str(dagster_home),
        "LAKEHOUSE_CONFIG": str(config_file),
    }
    # This process reads the table and the instance itself: set the variables before importing the package.
    os.environ.update(settings)
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    return Workdir(root, home, dagster_home, config_file, root / "dagster-dev.log", env)


def start_dagster(args: argparse.Namespace, work: Workdir, port: int) -> subprocess.Popen[bytes]:
    """``dagster dev`` in its own process group (session), its output in the log file."""
    command = [str(BIN / "dagster"), "dev", "-w", "workspace.yaml", "-p", str(port), "-h", "127.0.0.1"]
    with open(work.log_file, "wb") as log:
        return subprocess.Popen(
            command,
            cwd=args.project_root,
            env=work.env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def log_tail(work: Workdir, lines: int = 40) -> str:
    """The last lines of the ``dagster dev`` log, for error messages."""
    try:
        return "\n".join(work.log_file.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def http_get(url: str, timeout: float = 5) -> bytes:
    """GET ``url`` and return the body."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


def graphql(port: int, query: str, variables: dict[str, Any] | None = None, timeout: float = 30) -> dict[str, Any]:
    """POST a GraphQL query to the webserver; its ``data``, or GraphQLError with its errors."""
    body = json.dumps({"query": query, "variables": variables or {}}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        answer = json.loads(response.read())
    if answer.get("errors"):
        raise GraphQLError(f"GraphQL errors: {answer['errors']}")
    return answer["data"]


def ensure_running(process: subprocess.Popen[bytes], work: Workdir) -> None:
    """Raise when ``dagster dev`` has exited."""
    if process.poll() is not None:
        raise RuntimeError(f"dagster dev exited with code {process.returncode}; log tail:\n{log_tail(work)}")


def loaded_location(port: int) -> Location | None:
    """The loaded code location, None while loading; RuntimeError when it failed to load."""
    workspace = graphql(port, WORKSPACE_QUERY)["workspaceOrError"]
    if workspace["__typename"] != "Workspace":
        raise RuntimeError(f"workspace error: {workspace.get('message')}")
    for entry in workspace["locationEntries"]:
        loaded = entry["locationOrLoadError"]
        if entry["loadStatus"] != "LOADED" or loaded is None:
            return None
        if loaded["__typename"] == "PythonError":
            raise RuntimeError(f"code location {entry['name']} failed to load: {loaded['message']}")
        return Location(entry["name"], loaded["repositories"][0]["name"])
    return None


def latest_tick(port: int, location: Location, sensor: str) -> dict[str, Any] | None:
    """The sensor's newest tick (status, timestamp, skip reason, error), or None before its first."""
    selector = {
        "repositoryLocationName": location.location,
        "repositoryName": location.repository,
        "sensorName": sensor,
    }
    answer = graphql(port, SENSOR_QUERY, {"selector": selector})["sensorOrError"]
    if answer["__typename"] != "Sensor":
        raise RuntimeError(f"sensor {sensor}: {answer.get('message', answer['__typename'])}")
    ticks = answer["sensorState"]["ticks"]
    return ticks[0] if ticks else None


def wait_until_ready(
    process: subprocess.Popen[bytes],
    work: Workdir,
    port: int,
    since: float,
    timeout: float,
    sensor: str = LANDING_SENSOR,
) -> tuple[Location, dict[str, float]]:
    """Wait for the webserver, the loaded code location and a tick of ``sensor`` after ``since``."""
    deadline = time.monotonic() + timeout
    marks: dict[str, float] = {}
    location: Location | None = None
    last_error = ""
    while time.monotonic() < deadline:
        ensure_running(process, work)
        try:
            if "webserver" not in marks:
                http_get(f"http://127.0.0.1:{port}/server_info")
                marks["webserver"] = time.time() - since
            if location is None:
                location = loaded_location(port)
                if location is not None:
                    marks["code_location"] = time.time() - since
            if location is not None:
                tick = latest_tick(port, location, sensor)
                if tick and tick["timestamp"] >= since:
                    marks["first_sensor_tick"] = tick["timestamp"] - since
                    if tick["status"] == "FAILURE":
                        print(f"WARNING: first {sensor} tick failed: {(tick['error'] or {}).get('message')}")
                    return location, marks
        except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError, GraphQLError) as error:
            last_error = str(error)
        time.sleep(0.5)
    raise TimeoutError(
        f"dagster dev not ready after {timeout:.0f} s (reached: {sorted(marks) or 'nothing'}; last error: "
        f"{last_error or '-'}); log tail:\n{log_tail(work)}"
    )


def chunk_payload(first_id: int, count: int, rng: random.Random) -> bytes:
    """NDJSON of ``count`` events with consecutive ids from ``first_id``, stamped now (UTC)."""
    lines = [
        json.dumps(
            {
                "event_id": first_id + offset,
                "customer_id": rng.randint(1, 100_000),
                "amount": round(rng.uniform(1, 1000), 2),
                "status": rng.choice(STATUSES),
                "ts": datetime.now(timezone.utc).isoformat(),
            }
        )
        for offset in range(count)
    ]
    return ("\n".join(lines) + "\n").encode()


def landing_names(work: Workdir) -> set[str]:
    """Names of the stream's landing files (``$LAKEHOUSE_HOME/landing/<stream>``)."""
    directory = work.home / "landing" / STREAM
    return {p.name for p in directory.glob("*.ndjson")} if directory.is_dir() else set()


def ingest(work: Workdir, payload: bytes) -> list[str]:
    """Land ``payload`` with ``lakehouse ingest --stream bench_events -``; the landed file names."""
    before = landing_names(work)
    result = subprocess.run(
        [str(BIN / "lakehouse"), "ingest", "--stream", STREAM, "-"],
        input=payload,
        env=work.env,
        cwd=work.root,
        capture_output=True,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"lakehouse ingest failed ({result.returncode}): {result.stderr.decode(errors='replace')}")
    named = [
        Path(line.split(" ", 1)[1]).name for line in result.stdout.decode().splitlines() if line.startswith("landed ")
    ]
    return named or sorted(landing_names(work) - before)


def produce(args: argparse.Namespace, work: Workdir, process: subprocess.Popen[bytes]) -> list[Chunk]:
    """Land one chunk every ``--chunk-seconds`` on a fixed schedule; what each chunk landed and when."""
    per_chunk = max(1, round(args.rate * args.chunk_seconds))
    count = max(1, round(args.seconds / args.chunk_seconds))
    rng = random.Random(20261126)
    start_wall, start_mono = time.time(), time.monotonic()
    chunks: list[Chunk] = []
    for index in range(count):
        target = start_mono + index * args.chunk_seconds
        delay = target - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        ensure_running(process, work)
        first_id = index * per_chunk
        payload = chunk_payload(first_id, per_chunk, rng)
        started_mono, started_at = time.monotonic(), time.time()
        files = ingest(work, payload)
        landed_mono, landed_at = time.monotonic(), time.time()
        chunk = Chunk(
            index=index,
            first_event_id=first_id,
            last_event_id=first_id + per_chunk - 1,
            events=per_chunk,
            cumulative_events=(index + 1) * per_chunk,
            scheduled_at=start_wall + index * args.chunk_seconds,
            started_at=started_at,
            landed_at=landed_at,
            ingest_seconds=landed_mono - started_mono,
            late_start_seconds=max(0.0, started_mono - target),
            overran=landed_mono > target + args.chunk_seconds,
            landing_files=files,
        )
        chunks.append(chunk)
        note = "  OVERRAN its slot" if chunk.overran else ""
        ids = f"{chunk.first_event_id}..{chunk.last_event_id}"
        print(f"  chunk {index}: ids {ids}, ingest {chunk.ingest_seconds:.2f} s, landed {files}{note}")
    return chunks


class TablePoller(threading.Thread):
    """Every second, the table's committed ``total-records`` (PyIceberg, no JVM), as (time, count) samples."""

    def __init__(self, interval: float = 1.0) -> None:
        super().__init__(name="table-poller", daemon=True)
        from lakehouse_assets.lakehouse import Lakehouse

        self.interval = interval
        self.lake = Lakehouse.from_env()
        self.samples: list[tuple[float, int]] = []
        self.errors: list[str] = []
        self._halt = threading.Event()

    def read_total(self) -> int:
        """The current snapshot's total-records, 0 before the table or its first snapshot exists."""
        table = self.lake.table(TABLE)
        snapshot = table.current_snapshot() if table else None
        if snapshot is None or snapshot.summary is None:
            return 0
        return int(snapshot.summary["total-records"] or 0)

    def run(self) -> None:
        """Poll until stopped."""
        next_at = time.monotonic()
        while not self._halt.is_set():
            try:
                self.samples.append((time.time(), self.read_total()))
            except Exception as error:  # noqa: BLE001 - a commit may replace metadata mid-read: retry next poll
                self.errors.append(f"{time.time():.1f}: {type(error).__name__}: {error}")
            next_at += self.interval
            self._halt.wait(max(0.0, next_at - time.monotonic()))

    def latest(self) -> int:
        """The newest count read."""
        return self.samples[-1][1] if self.samples else 0

    def first_time_at_least(self, count: int) -> float | None:
        """The time of the first poll that counted at least ``count`` records."""
        return next((at for at, total in self.samples if total >= count), None)

    def stop(self) -> None:
        """Stop polling and wait for the thread."""
        self._halt.set()
        self.join(timeout=10)


def open_instance(work: Workdir) -> Any:
    """The Dagster instance ``dagster dev`` uses (same ``DAGSTER_HOME``)."""
    import dagster as dg

    return dg.DagsterInstance.from_config(str(work.dagster_home))


def runs_in_progress(instance: Any) -> list[str]:
    """``job (status)`` for every run that is not finished (queued, starting, started, canceling)."""
    import dagster as dg

    from lakehouse_assets.runtime.run_states import UNFINISHED

    runs = instance.get_runs(filters=dg.RunsFilter(statuses=list(UNFINISHED)))
    return [f"{run.job_name} ({run.status.value}) {run.run_id[:8]}" for run in runs]


def drain(
    args: argparse.Namespace,
    work: Workdir,
    process: subprocess.Popen[bytes],
    poller: TablePoller,
    instance: Any,
    expected: int,
) -> tuple[bool, float | None, str]:
    """Wait until ``expected`` records are committed and no run is in progress, up to ``--drain-timeout``.

    Returns (drained, seconds until all records were committed, what was still pending on timeout).
    """
    started = time.monotonic()
    deadline = started + args.drain_timeout
    committed_after: float | None = None
    idle_polls = 0
    while time.monotonic() < deadline:
        ensure_running(process, work)
        if committed_after is None and poller.latest() >= expected:
            committed_after = time.monotonic() - started
            print(f"  all {expected} events committed {committed_after:.1f} s after the last chunk landed")
        if committed_after is not None:
            # Two idle looks 2 s apart, so a retry the daemon is about to launch is not missed.
            idle_polls = idle_polls + 1 if not runs_in_progress(instance) else 0
            if idle_polls >= 2:
                return True, committed_after, ""
            time.sleep(2)
        else:
            time.sleep(1)
    pending = (
        f"committed {poller.latest()} of {expected} events; runs in progress: {runs_in_progress(instance) or 'none'}"
    )
    return False, committed_after, pending


def failed_sensor_ticks(port: int, location: Location) -> list[str]:
    """The last failed ticks of every sensor (message first line), read before stopping dagster dev."""
    repository = {"repositoryLocationName": location.location, "repositoryName": location.repository}
    answer = graphql(port, FAILED_TICKS_QUERY, {"repository": repository})["sensorsOrError"]
    failures = []
    for sensor in answer.get("results", []):
        for tick in sensor["sensorState"]["ticks"]:
            message = ((tick.get("error") or {}).get("message") or "").strip().splitlines()
            failures.append(f"{sensor['name']} at {tick['timestamp']:.0f}: {message[0] if message else '?'}")
    return failures


def process_group_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` still exists."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def process_command(pid: int) -> str:
    """The command line of process ``pid``, or "" when it is gone."""
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def group_members(pgid: int) -> list[int]:
    """Live processes of process group ``pgid`` (from /proc)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def processes_with_home(home: Path) -> list[int]:
    """Live processes (other than this one) whose environment has ``LAKEHOUSE_HOME=<home>``."""
    marker = f"LAKEHOUSE_HOME={home}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


def stop_dagster(process: subprocess.Popen[bytes], work: Workdir) -> list[int]:
    """SIGTERM the ``dagster dev`` group, up to 30 s, SIGKILL what is left; also any stray process
    started under this benchmark's home (run workers, code servers, Spark JVMs). Returns the pids killed."""
    pgid = process.pid
    if process_group_alive(pgid):
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (process.poll() is None or process_group_alive(pgid)):
            time.sleep(0.2)
    killed = group_members(pgid)
    for pid in killed:  # named before they go: which of dagster dev's processes ignored the SIGTERM
        print(f"WARNING: still alive 30 s after SIGTERM, killed: {pid} {process_command(pid)[:160]}")
    if killed:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        print(f"WARNING: dagster dev (pid {process.pid}) did not exit after SIGKILL")
    for _ in range(3):
        strays = processes_with_home(work.home)
        if not strays:
            break
        for pid in strays:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
        time.sleep(1)
    left = processes_with_home(work.home)
    if left:
        print(f"WARNING: processes still alive under {work.home}: {left}")
    return killed


def verify_exactly_once(expected: int, first_id: int, last_id: int) -> dict[str, Any]:
    """Count rows, distinct ids and the id range of the committed snapshot with DuckDB."""
    from lakehouse_assets.lakehouse import Lakehouse
    from lakehouse_assets.quality.duck import iceberg_connection, scan

    lake = Lakehouse.from_env()
    location = lake.metadata_location(TABLE)
    table = lake.table(TABLE) if location else None
    snapshot = table.current_snapshot() if table else None
    if location is None or snapshot is None:
        return {"ok": False, "rows": 0, "distinct": 0, "min": None, "max": None, "snapshots": 0, "commits": 0}
    columns = "count(*), count(DISTINCT event_id), min(event_id), max(event_id)"
    sql = f"SELECT {columns} FROM {scan(location, snapshot.snapshot_id)}"
    rows, distinct, low, high = iceberg_connection().sql(sql).fetchone()
    snapshots = table.metadata.snapshots
    commits = sum(1 for s in snapshots if s.summary is not None and s.summary["lakehouse.batch-range"] is not None)
    return {
        "ok": rows == expected and distinct == expected and low == first_id and high == last_id,
        "rows": rows,
        "distinct": distinct,
        "min": low,
        "max": high,
        "snapshot_id": snapshot.snapshot_id,
        "metadata_location": location,
        "snapshots": len(snapshots),
        "commits": commits,
    }


def metadata_values(metadata: Any) -> tuple[dict[str, float], dict[str, str]]:
    """Numeric and text metadata of a materialization or check (other kinds are skipped)."""
    numbers, texts = {}, {}
    for key, entry in (metadata or {}).items():
        value = getattr(entry, "value", entry)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            numbers[key] = float(value)
        elif isinstance(value, str):
            texts[key] = value
    return numbers, texts


def error_text(entry: Any) -> str:
    """The error message of a failure event, first lines only."""
    data = getattr(entry.dagster_event, "event_specific_data", None)
    error = getattr(data, "error", None)
    message = getattr(error, "message", None) or entry.message or ""
    return " | ".join(line.strip() for line in message.strip().splitlines()[:3])


def run_timeline(instance: Any, record: Any) -> dict[str, Any]:
    """One run's status, event times and time split (seconds), from its record and event log."""
    from dagster import DagsterEventType as E

    run = record.dagster_run
    created = record.create_timestamp.timestamp()
    first: dict[str, float] = {}
    steps: dict[str, dict[str, Any]] = {}
    materializations: list[dict[str, Any]] = []
    checks: list[dict[str, Any]] = []
    errors: list[str] = []
    for entry in instance.all_logs(run.run_id):
        event = entry.dagster_event
        if event is None:
            continue
        kind, at = event.event_type_value, entry.timestamp
        first.setdefault(kind, at)
        if kind == E.STEP_START.value:
            steps.setdefault(event.step_key, {})["start"] = at
        elif kind in (E.STEP_SUCCESS.value, E.STEP_FAILURE.value):
            steps.setdefault(event.step_key, {}).update(end=at, status=kind)
            if kind == E.STEP_FAILURE.value:
                errors.append(f"step {event.step_key}: {error_text(entry)}")
        elif kind == E.RUN_FAILURE.value:
            errors.append(f"run: {error_text(entry)}")
        elif kind == E.ASSET_MATERIALIZATION.value and entry.asset_materialization is not None:
            numbers, texts = metadata_values(entry.asset_materialization.metadata)
            asset = entry.asset_materialization.asset_key.to_user_string()
            materializations.append({"asset": asset, "at": at, "numbers": numbers, "texts": texts})
        elif kind == E.ASSET_CHECK_EVALUATION.value and entry.asset_check_evaluation is not None:
            evaluation = entry.asset_check_evaluation
            checks.append({"check": evaluation.check_name, "passed": evaluation.passed, "at": at})
    starting, started = first.get(E.RUN_STARTING.value), first.get(E.RUN_START.value)
    end_kinds = (E.RUN_SUCCESS.value, E.RUN_FAILURE.value, E.RUN_CANCELED.value)
    ended = next((first[kind] for kind in end_kinds if kind in first), None)
    parts: dict[str, float] = {}

    def part(name: str, begin: float | None, end: float | None) -> None:
        if begin is not None and end is not None:
            parts[name] = round(end - begin, 3)

    part("queued (created -> launch)", created, starting)
    part("process start (launch -> RUN_START)", starting, started)
    step_starts = [s["start"] for s in steps.values() if "start" in s]
    step_ends = [s["end"] for s in steps.values() if "end" in s]
    part("to first step (RUN_START -> STEP_START)", started, min(step_starts, default=None))
    ordered = sorted(steps.items(), key=lambda item: item[1].get("start", 0))
    for key, step in ordered:
        part(f"step {key}", step.get("start"), step.get("end"))
    # In-process steps run one after another: a gap is a step waiting, e.g. for the table's commit pool.
    waits = [
        max(0.0, nxt["start"] - prev["end"])
        for (_, prev), (_, nxt) in zip(ordered, ordered[1:], strict=False)
        if "end" in prev and "start" in nxt
    ]
    if waits:
        parts["between steps (e.g. commit pool wait)"] = round(sum(waits), 3)
    part("after last step (-> run end)", max(step_ends, default=None), ended)
    part("total (created -> run end)", created, ended)
    for mat in materializations:
        part(f"materialized {mat['asset']} (after RUN_START)", started, mat["at"])
    if checks:
        part("first check evaluated (after RUN_START)", started, min(c["at"] for c in checks))
        part("last check evaluated (after RUN_START)", started, max(c["at"] for c in checks))
    return {
        "run_id": run.run_id,
        "job": run.job_name,
        "status": run.status.value,
        "tags": dict(run.tags),
        "run_config": json.dumps(run.run_config, default=str),
        "created": created,
        "launched": starting,
        "started": started,
        "ended": ended,
        "parts": parts,
        "materializations": materializations,
        "checks": checks,
        "errors": errors,
    }


def collect_runs(instance: Any) -> list[dict[str, Any]]:
    """Every run of the instance, oldest first, with its time split."""
    records = sorted(instance.get_run_records(), key=lambda r: r.create_timestamp)
    return [run_timeline(instance, record) for record in records]


def stats(values: list[float]) -> dict[str, float]:
    """Median, max and count."""
    return {"median": round(statistics.median(values), 3), "max": round(max(values), 3), "n": len(values)}


def nearest_rank(values: list[float], percent: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(percent / 100 * len(ordered))) - 1]


def job_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per job: runs by status, median/max of each time part and of ``*_seconds`` materialization metadata."""
    jobs: dict[str, Any] = {}
    for run in runs:
        job = jobs.setdefault(run["job"], {"statuses": {}, "parts": {}, "metadata_seconds": {}, "failed_checks": 0})
        job["statuses"][run["status"]] = job["statuses"].get(run["status"], 0) + 1
        for name, seconds in run["parts"].items():
            job["parts"].setdefault(name, []).append(seconds)
        for mat in run["materializations"]:
            for key, value in mat["numbers"].items():
                if key.endswith("_seconds"):
                    job["metadata_seconds"].setdefault(f"{mat['asset']}: {key}", []).append(value)
        job["failed_checks"] += sum(1 for c in run["checks"] if not c["passed"])
    for job in jobs.values():
        job["parts"] = {name: stats(values) for name, values in job["parts"].items()}
        job["metadata_seconds"] = {name: stats(values) for name, values in sorted(job["metadata_seconds"].items())}
    return jobs


def batch_range(texts: dict[str, str], numbers: dict[str, float]) -> tuple[int, int] | None:
    """The batch sequences a commit's materialization covers, from ``batch_range`` ("a-b") if present."""
    text = texts.get("batch_range")
    if text and "-" in text:
        low, high = text.split("-", 1)
        if low.strip().isdigit() and high.strip().isdigit():
            return int(low), int(high)
    if "commit_sequence" in numbers:
        return int(numbers["commit_sequence"]), int(numbers["commit_sequence"])
    return None


def gap(begin: float | None, end: float | None) -> float | None:
    """``end - begin`` in seconds, or None when either is unknown."""
    return round(end - begin, 3) if begin is not None and end is not None else None


def trace_chunks(chunks: list[Chunk], runs: list[dict[str, Any]]) -> None:
    """Per chunk, where its time went: wait for a batch, writer queue, staging, commit, poll.

    The writer run is the one whose run config names the chunk's landing file; the commit is the
    table materialization (in whichever run) whose ``batch_range`` covers that run's sequence, else
    the first after the batch was staged.
    """
    writers = [run for run in runs if run["job"] == STAGE_JOB]
    table_materializations = [
        (run, mat) for run in runs for mat in run["materializations"] if mat["asset"] == TABLE_ASSET
    ]
    commits = sorted(table_materializations, key=lambda pair: pair[1]["at"])
    for chunk in chunks:
        candidates = [run for run in writers if any(name in run["run_config"] for name in chunk.landing_files)]
        writer = next((r for r in candidates if r["status"] == "SUCCESS"), candidates[-1] if candidates else None)
        staged = None
        commit: tuple[dict[str, Any], dict[str, Any]] | None = None
        if writer is not None:
            staged = next((m["at"] for m in writer["materializations"] if m["asset"] == STAGING_ASSET), None)
            sequence = writer["tags"].get(SEQUENCE_TAG, "")
            for run, mat in commits:
                covered = batch_range(mat["texts"], mat["numbers"])
                if covered and sequence.isdigit() and covered[0] <= int(sequence) <= covered[1]:
                    commit = (run, mat)
                    break
            after = staged or writer["started"]
            if commit is None and after is not None:
                commit = next(((run, mat) for run, mat in commits if mat["at"] >= after), None)
        created, launched = (writer["created"], writer["launched"]) if writer else (None, None)
        committed = commit[1]["at"] if commit else None
        chunk.committed_by = commit[0]["job"] if commit else None
        chunk.path = {
            "landed -> writer run created": gap(chunk.landed_at, created),
            "writer run queued (created -> launched)": gap(created, launched),
            "writer launched -> batch staged": gap(launched, staged),
            "staged -> committed (table materialized)": gap(staged, committed),
            "committed -> seen by the poller": gap(committed, chunk.visible_at),
        }


def versions() -> dict[str, str]:
    """Installed versions of the pieces measured."""
    found = {"python": platform.python_version()}
    for package in ("pyspark", "dagster", "duckdb", "pyiceberg"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = "not installed"
    return found


def fmt(seconds: float | None) -> str:
    """Seconds with one decimal, or a dash."""
    return "-" if seconds is None else f"{seconds:.1f} s"


def print_summary(result: dict[str, Any], chunks: list[Chunk]) -> None:
    """The human-readable report."""
    s = result["summary"]
    print("\n=== dagster dev freshness ===")
    print(f"machine: {s['machine']}")
    print("versions: " + ", ".join(f"{name} {version}" for name, version in s["versions"].items()))
    cfg = s["settings"]
    print(
        f"settings: {cfg['rate']} events/s for {cfg['seconds']:g} s, one ingest every {cfg['chunk_seconds']:g} s "
        f"({cfg['events_per_chunk']} events), flush.max_age {cfg['max_age']}, flush.max_bytes 64 MiB, "
        f"commit_interval 0s, drain timeout {cfg['drain_timeout']:g} s"
    )
    ready = s["startup"]
    print(
        f"dagster dev ready: webserver {fmt(ready.get('webserver'))}, code location {fmt(ready.get('code_location'))}, "
        f"first {LANDING_SENSOR} tick {fmt(ready.get('first_sensor_tick'))} after start"
    )
    ingest_times = [c.ingest_seconds for c in chunks]
    if ingest_times:
        print(
            f"ingest: {len(chunks)} chunks, lakehouse ingest median {statistics.median(ingest_times):.2f} s, "
            f"max {max(ingest_times):.2f} s, {sum(c.overran for c in chunks)} overran their slot"
        )
    fresh = s["freshness"]
    if fresh["n"]:
        print(
            f"freshness (ingest returned -> visible): p50 {fresh['p50']:.1f} s, p95 {fresh['p95']:.1f} s, "
            f"max {fresh['max']:.1f} s over {fresh['n']} chunks"
            + (f"; {fresh['not_visible']} chunks never visible" if fresh["not_visible"] else "")
        )
    else:
        print("freshness: no chunk became visible")
    print(
        f"events: {s['events_landed']} landed, {s['events_committed']} committed; snapshots {s['snapshots']} "
        f"({s['commits']} commits)"
    )
    drained = s["drain"]
    print(
        "drain: "
        + (
            f"all committed {fmt(drained['committed_after'])} after the last chunk, runs idle"
            if drained["ok"]
            else f"TIMED OUT after {drained['timeout']:g} s: {drained['pending']}"
        )
    )
    if s["stray_processes_killed"]:
        print(f"processes killed at stop (SIGKILL): {s['stray_processes_killed']}")
    if s["sensor_failures"]:
        print("SENSOR TICK FAILURES:")
        for line in s["sensor_failures"]:
            print(f"  {line}")
    if s["poll_errors"]:
        print(f"poller: {len(s['poll_errors'])} reads failed (retried), first: {s['poll_errors'][0]}")
    print("runs by job:")
    for job, info in s["jobs"].items():
        statuses = ", ".join(f"{count} {status}" for status, count in sorted(info["statuses"].items()))
        failed_checks = f"; {info['failed_checks']} failed check evaluations" if info["failed_checks"] else ""
        print(f"  {job}: {statuses}{failed_checks}")
    for failure in s["failed_runs"]:
        print(f"  RUN FAILED: {failure['job']} {failure['run_id']}")
        for error in failure["errors"]:
            print(f"    {error}")
    if s["chunk_path"]:
        committers = sorted({c.committed_by or "?" for c in chunks})
        by = ", ".join(f"{job} {sum((c.committed_by or '?') == job for c in chunks)}" for job in committers)
        print(f"where a chunk's time goes (median / max over chunks; chunks committed by run of: {by}):")
        for name, value in s["chunk_path"].items():
            print(f"  {name:<45} {value['median']:7.1f} / {value['max']:7.1f} s")
    print("time split per job (median / max, seconds):")
    for job, info in s["jobs"].items():
        print(f"  {job} ({sum(info['statuses'].values())} runs)")
        for name, value in info["parts"].items():
            print(f"    {name:<60} {value['median']:7.2f} / {value['max']:7.2f}  (n={value['n']})")
        for name, value in info["metadata_seconds"].items():
            print(f"    metadata {name:<51} {value['median']:7.2f} / {value['max']:7.2f}  (n={value['n']})")
    check = s["exactly_once"]
    print(
        f"exactly once: {'yes' if check['ok'] else 'NO'} ({check['rows']} rows, {check['distinct']} distinct event_id, "
        f"ids {check['min']}..{check['max']}; expected {s['events_landed']} rows, ids {s['expected_ids']})"
    )


def summarise(
    args: argparse.Namespace,
    chunks: list[Chunk],
    poller: TablePoller,
    runs: list[dict[str, Any]],
    check: dict[str, Any],
    extras: dict[str, Any],
) -> dict[str, Any]:
    """Freshness per chunk, run statistics and the verdict, as one JSON-ready dict."""
    for chunk in chunks:
        chunk.visible_at = poller.first_time_at_least(chunk.cumulative_events)
        chunk.freshness_seconds = round(chunk.visible_at - chunk.landed_at, 3) if chunk.visible_at else None
    trace_chunks(chunks, runs)
    fresh = [c.freshness_seconds for c in chunks if c.freshness_seconds is not None]
    landed = sum(c.events for c in chunks)
    path_names = list(chunks[0].path) if chunks else []
    chunk_path = {
        name: stats(values)
        for name in path_names
        if (values := [c.path[name] for c in chunks if c.path.get(name) is not None])
    }
    failed_runs = [
        {"job": run["job"], "run_id": run["run_id"], "errors": run["errors"]}
        for run in runs
        if run["status"] == "FAILURE"
    ]
    summary = {
        "machine": f"{platform.platform()} {platform.machine()}, {os.cpu_count()} cpus",
        "versions": versions(),
        "settings": {
            "rate": args.rate,
            "seconds": args.seconds,
            "chunk_seconds": args.chunk_seconds,
            "events_per_chunk": chunks[0].events if chunks else 0,
            "max_age": args.max_age,
            "drain_timeout": args.drain_timeout,
        },
        "freshness": {
            "n": len(fresh),
            "not_visible": len(chunks) - len(fresh),
            "p50": nearest_rank(fresh, 50) if fresh else None,
            "p95": nearest_rank(fresh, 95) if fresh else None,
            "max": max(fresh) if fresh else None,
        },
        "events_landed": landed,
        "events_committed": check["rows"],
        "expected_ids": f"0..{landed - 1}",
        "snapshots": check["snapshots"],
        "commits": check["commits"],
        "jobs": job_summary(runs),
        "failed_runs": failed_runs,
        "chunk_path": chunk_path,
        "exactly_once": check,
        "poll_errors": poller.errors,
        **extras,
    }
    ok = check["ok"] and not failed_runs and extras["drain"]["ok"]
    summary["ok"] = ok
    return {
        "summary": summary,
        "chunks": [asdict(c) for c in chunks],
        "runs": runs,
        "poll_samples": [list(s) for s in poller.samples],
    }


def tidy(work: Workdir, keep: bool) -> None:
    """Without ``--keep``, remove the lakehouse home and Dagster instance; result and log stay."""
    if not keep:
        shutil.rmtree(work.home, ignore_errors=True)
        shutil.rmtree(work.dagster_home, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; 0 when every event is in the table exactly once, no run failed and it drained."""
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = make_workdir(args)
    port = args.port or free_port()
    print(f"workdir {work.root}; dagster dev on http://127.0.0.1:{port} (log {work.log_file})")
    process: subprocess.Popen[bytes] | None = None
    poller: TablePoller | None = None
    instance = None
    ok = False
    try:
        since = time.time()
        process = start_dagster(args, work, port)
        location, startup = wait_until_ready(process, work, port, since, args.startup_timeout)
        print(f"ready: {startup} (location {location.location}, repository {location.repository})")
        poller = TablePoller()
        poller.start()
        chunks = produce(args, work, process)
        instance = open_instance(work)
        expected = sum(c.events for c in chunks)
        drained, committed_after, pending = drain(args, work, process, poller, instance, expected)
        try:
            sensor_failures = failed_sensor_ticks(port, location)
        except (urllib.error.URLError, RuntimeError, TimeoutError) as error:
            sensor_failures = [f"(could not read sensor ticks: {error})"]
        poller.stop()
        killed = stop_dagster(process, work)
        process = None
        runs = collect_runs(instance)
        check = verify_exactly_once(expected, 0, expected - 1)
        extras = {
            "startup": startup,
            "drain": {
                "ok": drained,
                "committed_after": committed_after,
                "pending": pending,
                "timeout": args.drain_timeout,
            },
            "stray_processes_killed": killed,
            "sensor_failures": sensor_failures,
            "workdir": str(work.root),
        }
        result = summarise(args, chunks, poller, runs, check, extras)
        ok = result["summary"]["ok"]
        print_summary(result, chunks)
        for path in [work.root / "result.json", *([args.json_out] if args.json_out else [])]:
            path.write_text(json.dumps(result, indent=2, default=str))
            print(f"result: {path}")
    finally:
        if poller is not None:
            poller.stop()
        if process is not None:
            killed = stop_dagster(process, work)
            print(f"stopped dagster dev (killed {killed or 'nothing'} after SIGTERM)")
        if instance is not None:
            instance.dispose()
        if ok:
            tidy(work, args.keep)
        else:
            print(f"kept {work.root} for inspection")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
