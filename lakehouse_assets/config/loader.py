"""The configuration in use: ``$LAKEHOUSE_CONFIG``, else ``./lakehouse.yaml``, else the packaged
demo, with a derived stream for every table the routers have routed events to so far."""

from __future__ import annotations

import functools
import os
from importlib import resources
from pathlib import Path

import yaml

from lakehouse_assets.config.routed_streams import with_routes
from lakehouse_assets.config.spec import LakehouseConfig, parse_config
from lakehouse_assets.errors import ConfigError
from lakehouse_assets.paths import LakehousePaths

CONFIG_ENV = "LAKEHOUSE_CONFIG"
DEFAULT_CONFIG_FILE = "lakehouse.yaml"
DEMO_CONFIG_RESOURCE = "demo_lakehouse.yaml"


def config_path() -> Path | None:
    """The configuration file in use: ``$LAKEHOUSE_CONFIG``, else ``./lakehouse.yaml`` if present."""
    explicit = os.environ.get(CONFIG_ENV)
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise ConfigError(f"{CONFIG_ENV}={explicit} does not name a file")
        return path
    default = Path(DEFAULT_CONFIG_FILE)
    return default if default.is_file() else None


def load_config() -> LakehouseConfig:
    """Load and validate the configuration in use, with its routers' derived streams.

    Runs call this many times (per table of a router, per check): the file and the route
    directories are read each time, but the configuration is built again only when they changed.
    """
    path = config_path()
    if path is None:
        text = resources.files("lakehouse_assets").joinpath(DEMO_CONFIG_RESOURCE).read_text()
        origin = f"packaged {DEMO_CONFIG_RESOURCE}"
    else:
        text = path.read_text()
        origin = str(path)
    routes = LakehousePaths.from_env().routes
    return _built(text, origin, str(routes), _route_listing(routes))


def _route_listing(routes: Path) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """Each router's route directory and the tables in it: what the derived streams are made of."""
    if not routes.is_dir():
        return ()
    routers = sorted(entry for entry in os.listdir(routes) if (routes / entry).is_dir())
    return tuple((router, tuple(sorted(os.listdir(routes / router)))) for router in routers)


@functools.lru_cache(maxsize=8)
def _built(text: str, origin: str, routes: str, _listing: tuple) -> LakehouseConfig:
    """The validated configuration of ``text`` with the derived streams of ``routes`` as listed
    (immutable, so shared by every caller)."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ConfigError(f"{origin} is not valid YAML: {error}") from None
    return with_routes(parse_config(raw, origin), Path(routes))
