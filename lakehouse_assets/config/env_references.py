"""``${env:NAME}`` in a configuration value: read from the environment when the value is used, so
secrets (catalog passwords, HTTP tokens) stay out of the configuration file."""

from __future__ import annotations

import os
import re

from lakehouse_assets.errors import ConfigError

ENV_REFERENCE = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)\}")


def resolve_env_references(value: str, where: str) -> str:
    """``value`` with every ``${env:NAME}`` replaced by the variable's value; a ConfigError names
    ``where`` (the key) and the variable when it is not set."""

    def from_environment(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in os.environ:
            raise ConfigError(f"{where} refers to environment variable {name}, which is not set")
        return os.environ[name]

    return ENV_REFERENCE.sub(from_environment, value)
