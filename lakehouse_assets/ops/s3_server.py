"""A local S3-compatible object store for the object-store tests and demo: S3Proxy on loopback.

S3Proxy (Apache-2.0, ``jvm/maven/s3-server.pom.xml``) answers the S3 API (path-style requests,
AWS signature v2 and v4, multipart uploads, ranged reads) and keeps each bucket as a directory
under ``directory/objects``, so a restart finds every object again. One process, no Docker, no
Go build: it comes from Maven Central like the other servers. Not for production.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from lakehouse_assets.jvm.connectors import S3_SERVER
from lakehouse_assets.ops.jvm_server import JvmServer, free_port, running

if TYPE_CHECKING:
    from pyarrow import fs

REGION = "us-east-1"


@dataclass
class LocalS3Server(JvmServer):
    """The store's process, its endpoint and the one access key it accepts."""

    access_key_id: str = field(default_factory=lambda: f"lakehouse{secrets.token_hex(4)}")
    secret_access_key: str = field(default_factory=lambda: secrets.token_hex(16), repr=False)

    @classmethod
    def at(cls, directory: Path) -> LocalS3Server:
        """A store (not started yet) keeping its objects under ``directory``, on a free port."""
        return cls("the S3 server", S3_SERVER, directory, free_port())

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _settings(self) -> Path:
        settings = self.directory / "s3proxy.properties"
        lines = {
            "s3proxy.endpoint": self.endpoint,
            "s3proxy.authorization": "aws-v2-or-v4",
            "s3proxy.identity": self.access_key_id,
            "s3proxy.credential": self.secret_access_key,
            "jclouds.provider": "filesystem",
            "jclouds.filesystem.basedir": str(self.directory / "objects"),
            "jclouds.region": REGION,
        }
        settings.write_text("".join(f"{key}={value}\n" for key, value in lines.items()))
        return settings

    def start(self) -> None:
        """Start the store and wait until it accepts connections."""
        (self.directory / "objects").mkdir(parents=True, exist_ok=True)
        self.launch([*self.java("org.gaul.s3proxy.Main"), "--properties", str(self._settings())])

    def file_system(self) -> fs.S3FileSystem:
        """A pyarrow client of the store, allowed to create buckets."""
        from pyarrow import fs

        return fs.S3FileSystem(
            access_key=self.access_key_id,
            secret_key=self.secret_access_key,
            endpoint_override=self.endpoint,
            region=REGION,
            scheme="http",
            allow_bucket_creation=True,
        )

    def create_bucket(self, bucket: str) -> None:
        """Create ``bucket`` through the S3 API (nothing happens when it exists)."""
        self.file_system().create_dir(bucket)

    def client_properties(self) -> dict[str, str]:
        """The Iceberg FileIO properties (Spark's S3FileIO and PyIceberg's alike) for this store."""
        return {
            "io-impl": "org.apache.iceberg.aws.s3.S3FileIO",
            "s3.endpoint": self.endpoint,
            "s3.path-style-access": "true",
            "s3.access-key-id": self.access_key_id,
            "s3.secret-access-key": self.secret_access_key,
            "client.region": REGION,
        }


@contextmanager
def local_s3_server(directory: Path) -> Iterator[LocalS3Server]:
    """A running local store keeping its objects under ``directory``, stopped at the end."""
    with running(LocalS3Server.at(directory)) as server:
        yield server
