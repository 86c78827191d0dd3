"""HTTP ingest against its ceiling: events acknowledged per second by ``lakehouse serve`` under
``wrk`` (many connections, 1,000-event requests), and side by side the same events landed by
writing landing files directly (the ceiling), with the pipeline running (``lakehouse run
--until-idle`` over and over, consuming what lands) unless ``--no-pipeline``.

The phases alternate (files, HTTP, files, HTTP...) so both see the same pipeline load; medians are
printed. ``wrk`` is Debian's ``wrk`` package (``apt-get install wrk``).

    python bench/http_ingest.py [--seconds 15] [--connections 32] [--rounds 2] [--no-pipeline]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

TOKEN = "bench-token"
EVENTS_PER_REQUEST = 1000
GOAL_EVENTS_PER_SECOND = 100_000
GOAL_P99_MS = 50.0
GOAL_RATIO = 0.8
WRK_SCRIPT = """
wrk.method = "POST"
wrk.headers["Authorization"] = "Bearer {token}"
wrk.headers["Content-Type"] = "application/x-ndjson"
local body = io.open("{body}", "rb")
wrk.body = body:read("*a")
body:close()
local pause = {pause_ms}
if pause > 0 then
  -- Random pauses (mean: pause) so the connections do not fire in step, as independent producers.
  delay = function() return math.random(0, 2 * pause) end
end
done = function(summary, latency, requests)
  io.write(string.format("RESULT %d %d %d %d %d %d\\n", summary.requests, summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.duration, latency:percentile(50), latency:percentile(99)))
end
"""


def _events(count: int) -> list[bytes]:
    return [
        json.dumps(
            {
                "order_id": index,
                "customer_id": index % 9973,
                "amount": round(index * 0.37 % 1000, 2),
                "ts": f"2026-11-{1 + index % 28:02d}T12:00:00Z",
            }
        ).encode()
        + b"\n"
        for index in range(count)
    ]


@dataclass
class Phase:
    events_per_second: float
    p50_ms: float | None = None
    p99_ms: float | None = None
    refused: int = 0


def _described(phase: Phase) -> str:
    return (
        f"{phase.events_per_second:,.0f} events/s (p50 {phase.p50_ms:.1f} ms, p99 {phase.p99_ms:.1f} ms, "
        f"{phase.refused} refused)"
    )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _direct_files(directory: Path, lines: list[bytes], seconds: float, writers: int) -> Phase:
    """Landing files of ``lines`` written directly (write, fsync, rename, fsync the directory) by
    ``writers`` threads for ``seconds``: the ceiling of any way of landing events."""
    from lakehouse_assets.batches.landing import write_landing_file

    deadline = time.monotonic() + seconds
    written = [0] * writers

    def write(slot: int) -> None:
        while time.monotonic() < deadline:
            write_landing_file(directory, lines)
            written[slot] += len(lines)

    started = time.monotonic()
    threads = [threading.Thread(target=write, args=(slot,)) for slot in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return Phase(sum(written) / (time.monotonic() - started))


def _wrk(url: str, script_text: str, workdir: Path, seconds: float, connections: int, rate: float | None) -> Phase:
    """``wrk`` for ``seconds`` with ``connections`` connections: as fast as the server answers, or
    with a random pause after each answer that offers about ``rate`` events/s in all (wrk has no
    fixed-rate mode; the mean pause is each connection's share of the interval, so latency is
    measured at that load)."""
    pause_ms = round(connections * EVENTS_PER_REQUEST / rate * 1000) if rate else 0
    script = workdir / "post.lua"
    script.write_text(script_text.replace("{pause_ms}", str(pause_ms)))
    completed = subprocess.run(
        ["wrk", "-t2", f"-c{connections}", f"-d{seconds:g}s", "--timeout", "10s", "-s", str(script), url],
        capture_output=True,
        text=True,
        check=True,
    )
    line = next(line for line in completed.stdout.splitlines() if line.startswith("RESULT "))
    requests, refused, socket_errors, duration_us, p50_us, p99_us = (int(field) for field in line.split()[1:])
    if socket_errors:
        print(f"  wrk: {socket_errors} socket errors", file=sys.stderr)
    acknowledged = (requests - refused) * EVENTS_PER_REQUEST
    return Phase(acknowledged / (duration_us / 1e6), p50_us / 1000, p99_us / 1000, refused)


def _pipeline_loop(env: dict[str, str], stop: threading.Event, log: Path) -> None:
    """``lakehouse run --until-idle`` again and again until ``stop``: the pipeline consuming what
    lands (the run in progress is stopped with the benchmark: what it commits is not measured)."""
    with open(log, "ab") as output:
        while not stop.is_set():
            run = subprocess.Popen(
                [sys.executable, "-m", "lakehouse_assets.cli.main", "run", "--until-idle"],
                env=env,
                stdout=output,
                stderr=subprocess.STDOUT,
            )
            while run.poll() is None:
                if stop.wait(0.5):
                    run.kill()
                    run.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument(
        "--rate", type=float, default=GOAL_EVENTS_PER_SECOND, help="events/s offered for the latency phase"
    )
    parser.add_argument("--writers", type=int, default=4, help="threads writing files directly")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-pipeline", dest="pipeline", action="store_false")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("needs wrk: apt-get install wrk")

    workdir = Path(tempfile.mkdtemp(prefix="lakehouse-http-bench-"))
    port = _free_port()
    config = {
        "http": {"port": port, "max_pending_bytes": 64 * 1024**3},
        "spark_host": {"enabled": False},
        "streams": [
            {
                "name": "orders",
                "source": {"landing": {"http": {"tokens": [TOKEN]}}},
                "table_identifier": "bench.orders",
                "auto_create": True,
                "schema": {
                    "columns": [
                        {"name": "order_id", "type": "long", "required": True},
                        {"name": "customer_id", "type": "long"},
                        {"name": "amount", "type": "double"},
                        {"name": "ts", "type": "timestamptz"},
                    ]
                },
                "flush": {"max_bytes": 256 * 1024 * 1024, "max_age": "5s"},
                "commit_interval": "0s",
            }
        ],
    }
    (workdir / "lakehouse.yaml").write_text(yaml.safe_dump(config))
    env = {
        **os.environ,
        "LAKEHOUSE_HOME": str(workdir / "home"),
        "DAGSTER_HOME": str(workdir / "dagster"),
        "LAKEHOUSE_CONFIG": str(workdir / "lakehouse.yaml"),
    }
    os.environ.update(env)
    lines = _events(EVENTS_PER_REQUEST)
    body = workdir / "body.ndjson"
    body.write_bytes(b"".join(lines))
    script = WRK_SCRIPT.replace("{token}", TOKEN).replace("{body}", str(body))
    direct_directory = workdir / "direct"

    server = subprocess.Popen(
        [sys.executable, "-m", "lakehouse_assets.cli.main", "serve"],
        env=env,
        stdout=open(workdir / "serve.log", "wb"),  # noqa: SIM115 - the server's log, for its life
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}/v1/streams/orders/events"
    for _ in range(100):
        try:
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
            break
        except httpx.TransportError:
            time.sleep(0.1)
    stop = threading.Event()
    pipeline = threading.Thread(target=_pipeline_loop, args=(env, stop, workdir / "pipeline.log"))
    if args.pipeline:
        pipeline.start()
    files: list[Phase] = []
    http: list[Phase] = []
    paced: list[Phase] = []
    try:
        for round_number in range(1, args.rounds + 1):
            files.append(_direct_files(direct_directory, lines, args.seconds, args.writers))
            http.append(_wrk(url, script, workdir, args.seconds, args.connections, None))
            paced.append(_wrk(url, script, workdir, args.seconds, args.connections, args.rate))
            print(
                f"round {round_number}: files {files[-1].events_per_second:,.0f} events/s; HTTP as fast as "
                f"answered {_described(http[-1])}; HTTP offered {args.rate:,.0f}/s {_described(paced[-1])}",
                flush=True,
            )
    finally:
        stop.set()
        server.terminate()
        server.wait()
        if args.pipeline:
            pipeline.join()

    direct = statistics.median(phase.events_per_second for phase in files)
    acknowledged = statistics.median(phase.events_per_second for phase in http)
    at_rate = statistics.median(phase.events_per_second for phase in paced)
    p50 = statistics.median(phase.p50_ms or 0 for phase in paced)
    p99 = statistics.median(phase.p99_ms or 0 for phase in paced)
    saturated_p99 = statistics.median(phase.p99_ms or 0 for phase in http)
    print()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"pipeline running: {args.pipeline}; {args.connections} connections, {EVENTS_PER_REQUEST}-event requests")
    print(f"direct files (ceiling): {direct:,.0f} events/s with {args.writers} writers")
    print(f"HTTP as fast as acked:  {acknowledged:,.0f} events/s (p99 {saturated_p99:.1f} ms: queueing at saturation)")
    print(f"HTTP offered {args.rate:,.0f}/s: {at_rate:,.0f} events/s acked, p50 {p50:.1f} ms, p99 {p99:.1f} ms")
    print(f"ratio HTTP / files:     {acknowledged / direct:.2f}")
    met = acknowledged >= GOAL_EVENTS_PER_SECOND and p99 < GOAL_P99_MS and acknowledged / direct >= GOAL_RATIO
    print(
        f"goal (>= {GOAL_EVENTS_PER_SECOND:,} events/s, p99 < {GOAL_P99_MS:g} ms, ratio >= {GOAL_RATIO}): "
        + ("met" if met else "not met")
    )
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
