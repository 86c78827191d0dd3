"""``lakehouse demo --object-store``: the demo with its tables on an S3-compatible store and in an
Iceberg REST catalog, configured as ``docs/deploy.md`` writes it, against local servers (S3Proxy
and Iceberg's REST catalog server, from Maven's jars, keeping their objects and tables under
``$LAKEHOUSE_HOME/object-store``). With ``--keep-running`` the servers stay up after the demo, for
``lakehouse sql``, ``lakehouse check`` or ``make ui`` from another shell, until Ctrl-C or SIGTERM."""

from __future__ import annotations

import os
import shlex
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path

import yaml

from lakehouse_assets.cli.demo import run_demo
from lakehouse_assets.config.loader import CONFIG_ENV, DEMO_CONFIG_RESOURCE
from lakehouse_assets.ops.rest_catalog_server import LocalRestCatalog, local_rest_catalog
from lakehouse_assets.ops.s3_server import local_s3_server
from lakehouse_assets.paths import LakehousePaths

BUCKET = "analytics-lake"
WAREHOUSE = f"s3://{BUCKET}/warehouse"
# The store's keys reach the configuration by name, as docs/deploy.md writes them: never in a file.
KEY_ID_ENV = "LAKE_S3_KEY_ID"
SECRET_ENV = "LAKE_S3_SECRET"
CONFIG_FILE = "object-store-demo.yaml"


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


def demo_on(catalog: LocalRestCatalog, events: int, paths: LakehousePaths) -> int:
    """Write the demo's configuration for ``catalog`` into the home, give this process the store's
    keys and ``LAKEHOUSE_CONFIG``, and run the demo (``run_demo``) on it; its exit code."""
    assert catalog.store is not None
    config_path = paths.home / CONFIG_FILE
    config_path.parent.mkdir(parents=True, exist_ok=True)
    config_path.write_text(yaml.safe_dump(object_store_config(catalog), sort_keys=False))
    os.environ[KEY_ID_ENV] = catalog.store.access_key_id
    os.environ[SECRET_ENV] = catalog.store.secret_access_key
    os.environ[CONFIG_ENV] = str(config_path)
    print(f"the configuration: {config_path} (docs/deploy.md's catalog map for these servers)")
    return run_demo(events)


def write_environment(path: Path) -> None:
    """The variables another shell needs to use the running servers' lake (the home, the
    configuration, the store's throwaway keys), readable by this user alone: the keys are in the
    store's own settings beside it too, and printed nowhere."""
    names = ("LAKEHOUSE_HOME", "DAGSTER_HOME", CONFIG_ENV, KEY_ID_ENV, SECRET_ENV)
    lines = [f"{name}={shlex.quote(os.environ[name])}\n" for name in names if name in os.environ]
    path.unlink(missing_ok=True)
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as file:
        file.writelines(lines)


def _wait_for_a_stop_signal() -> None:
    """Block until SIGINT or SIGTERM."""
    stopped = threading.Event()
    for signal_number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signal_number, lambda *_: stopped.set())
    stopped.wait()


def run_object_store_demo(events: int, keep_running: bool) -> int:
    """Start the local store and REST catalog, run the demo on them and, ``keep_running``, keep
    them up until Ctrl-C or SIGTERM for commands from another shell."""
    paths = LakehousePaths.from_env()
    servers = paths.home / "object-store"
    with object_store_servers(servers) as catalog:
        assert catalog.store is not None
        print(f"S3Proxy on {catalog.store.endpoint} (bucket {BUCKET}), Iceberg's REST catalog on {catalog.uri}")
        code = demo_on(catalog, events, paths)
        if keep_running:
            environment = servers / "lakehouse.env"
            write_environment(environment)
            print("\nThe servers run until Ctrl-C. From another shell:")
            print(f"  set -a; . {environment}; set +a")
            print('  lakehouse sql "SELECT count(*) FROM sales.orders"; lakehouse check; make ui')
            _wait_for_a_stop_signal()
            print("stopping the servers")
    return code
