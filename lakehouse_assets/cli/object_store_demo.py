"""``lakehouse demo --object-store``: the demo with its tables on an S3-compatible store and in an
Iceberg REST catalog, configured as ``docs/deploy.md`` writes it, against local servers (S3Proxy
and Iceberg's REST catalog server, from Maven's jars, keeping their objects and tables under
``$LAKEHOUSE_HOME/object-store``). With ``--keep-running`` the servers stay up after the demo, for
``lakehouse sql``, ``lakehouse check`` or ``make ui`` from another shell, until Ctrl-C."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path

import yaml

from lakehouse_assets.config.loader import CONFIG_ENV, DEMO_CONFIG_RESOURCE
from lakehouse_assets.ops.rest_catalog_server import LocalRestCatalog, local_rest_catalog
from lakehouse_assets.ops.s3_server import local_s3_server
from lakehouse_assets.paths import LakehousePaths

BUCKET = "analytics-lake"
WAREHOUSE = f"s3://{BUCKET}/warehouse"
# The store's keys reach the configuration by name, as docs/deploy.md writes them.
KEY_ID_ENV = "LAKE_S3_KEY_ID"
SECRET_ENV = "LAKE_S3_SECRET"
CONFIG_FILE = "object-store-demo.yaml"
# This process waits in steps of this long, never in one blocking call: a stop signal may reach
# another of its threads (the AWS SDK's event loop, say), and Python runs the handler only when the
# main thread next runs Python code; ``signal.pause()`` would go on waiting.
WAKE_SECONDS = 1.0


@contextmanager
def object_store_servers(directory: Path) -> Iterator[LocalRestCatalog]:
    """A local store with ``BUCKET`` and a REST catalog over ``WAREHOUSE`` on it, under
    ``directory`` (a restart finds the objects and tables again), both stopped at the end."""
    with local_s3_server(directory / "s3") as store:
        store.create_bucket(BUCKET)
        with local_rest_catalog(directory / "rest-catalog", store, WAREHOUSE) as catalog:
            yield catalog


def object_store_config(catalog: LocalRestCatalog) -> dict:
    """The packaged demo's streams, with ``catalog`` and its store as ``docs/deploy.md``'s
    ``catalog`` map: the keys named by environment variable (``KEY_ID_ENV``, ``SECRET_ENV``)."""
    demo = yaml.safe_load(resources.files("lakehouse_assets").joinpath(DEMO_CONFIG_RESOURCE).read_text())
    credentials = {"s3.access-key-id": f"${{env:{KEY_ID_ENV}}}", "s3.secret-access-key": f"${{env:{SECRET_ENV}}}"}
    return {**demo, "catalog": catalog.catalog_properties() | credentials}


def demo_environment(catalog: LocalRestCatalog, paths: LakehousePaths) -> dict[str, str]:
    """Write the demo's configuration for ``catalog`` into the home; the variables that point a
    ``lakehouse`` command at it: the home, the configuration and the store's keys."""
    assert catalog.store is not None
    config_path = paths.home / CONFIG_FILE
    config_path.write_text(yaml.safe_dump(object_store_config(catalog), sort_keys=False))
    environment = {
        "LAKEHOUSE_HOME": str(paths.home),
        CONFIG_ENV: str(config_path),
        KEY_ID_ENV: catalog.store.access_key_id,
        SECRET_ENV: catalog.store.secret_access_key,
    }
    if "DAGSTER_HOME" in os.environ:
        environment["DAGSTER_HOME"] = os.environ["DAGSTER_HOME"]
    return environment


def write_environment(path: Path, environment: dict[str, str]) -> None:
    """``environment`` as a file a shell sources, readable by this user alone."""
    path.unlink(missing_ok=True)
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as file:
        file.writelines(f"{name}={shlex.quote(value)}\n" for name, value in environment.items())


def _run_to_its_end(command: list[str], environment: dict[str, str]) -> int:
    """Run ``command`` and return its exit code; a stop signal that ends the wait kills it."""
    process = subprocess.Popen(command, env=environment)
    try:
        while True:
            with contextlib.suppress(subprocess.TimeoutExpired):
                return process.wait(timeout=WAKE_SECONDS)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def run_object_store_demo(events: int, keep_running: bool) -> int:
    """Start the local store and REST catalog, run ``lakehouse demo`` on them in a process of its
    own (its JVM ends with it) and, ``keep_running``, keep them up until Ctrl-C, SIGTERM or SIGHUP
    for commands from another shell. The servers stop on any of those signals, demo or not."""
    paths = LakehousePaths.from_env()
    # The servers' settings and logs hold the store's throwaway key: this user's alone.
    servers = paths.home / "object-store"
    servers.mkdir(mode=0o700, parents=True, exist_ok=True)
    servers.chmod(0o700)
    # Each ends the servers' blocks as Ctrl-C does; SIGINT too, which a shell's background job
    # starts with ignored (Python then installs no handler of its own for it).
    for stop in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(stop, signal.default_int_handler)
    code = None
    try:
        with object_store_servers(servers) as catalog:
            assert catalog.store is not None
            print(f"S3Proxy on {catalog.store.endpoint} (bucket {BUCKET}), Iceberg's REST catalog on {catalog.uri}")
            environment = demo_environment(catalog, paths)
            print(f"the configuration: {environment[CONFIG_ENV]} (docs/deploy.md's catalog map for these servers)")
            demo = [sys.executable, "-m", "lakehouse_assets.cli.main", "demo", "--events", str(events)]
            code = _run_to_its_end(demo, os.environ | environment)
            if not keep_running:
                print("the servers stop now; `make object-store-demo` keeps them up for your own queries")
                return code
            write_environment(servers / "lakehouse.env", environment)
            print("\nThe servers run until Ctrl-C. From another shell:")
            print(f"  set -a; . {servers / 'lakehouse.env'}; set +a")
            print('  lakehouse sql "SELECT count(*) FROM sales.orders"; lakehouse check; make ui')
            while True:
                time.sleep(WAKE_SECONDS)
    except KeyboardInterrupt:
        print("the servers are stopped")
    return 130 if code is None else code
