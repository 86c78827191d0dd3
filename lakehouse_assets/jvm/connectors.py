"""Jars from Maven Central that only some configurations need, fetched once into a local cache.

The embedded default needs none (the Iceberg runtime comes from PyPI). A Kafka stream needs
Spark's Kafka source (``spark-kafka``); a warehouse on S3 the AWS SDK for Iceberg's S3FileIO
(``iceberg-aws``). The local servers of the demos and the tests need theirs: Kafka itself
(``kafka-broker``), an S3-compatible store (``s3-server``) and Iceberg's REST catalog server
(``rest-catalog``); the object-store benchmark Hadoop's S3A file system (``hadoop-aws``). Each set
is a pom shipped in this package; Maven copies its jars into ``$LAKEHOUSE_JARS_DIR/<set>`` (default
``~/.cache/lakehouse_assets/jars``), and a marker file written last says the set is whole, so a
fetch that died is fetched again.

Spark's own ``spark.jars.packages`` resolves through Ivy on every JVM start; with a Maven cache
beside it Ivy was seen to fail on ``bundle`` packaging here (snappy-java), so the project fetches
with Maven once and hands Spark plain jar files. A user who prefers Ivy sets
``spark.jars.packages`` in the ``spark`` map, and the engine then adds nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from importlib import resources
from pathlib import Path

from lakehouse_assets.errors import LakehouseError

JARS_DIR_ENV = "LAKEHOUSE_JARS_DIR"
SPARK_KAFKA = "spark-kafka"
KAFKA_BROKER = "kafka-broker"
ICEBERG_AWS = "iceberg-aws"
S3_SERVER = "s3-server"
REST_CATALOG_SERVER = "rest-catalog"
HADOOP_AWS = "hadoop-aws"
SPARK_KAFKA_PACKAGE = "org.apache.spark:spark-sql-kafka-0-10_2.12:3.5.7"
COMPLETE_MARKER = ".complete"
# The AWS SDK (2.30 on) sends a checksum trailer with every upload and checks one on downloads by
# default; S3-compatible stores (S3Proxy, older MinIO and Ceph) reject the trailer's signature. For
# a store other than AWS the SDK's own settings send and check checksums only where S3 requires
# them: as JVM system properties (Spark's JVMs) or environment variables (the servers), by name.
S3_COMPATIBLE_SDK_SETTINGS = {
    "aws.requestChecksumCalculation": "WHEN_REQUIRED",
    "aws.responseChecksumValidation": "WHEN_REQUIRED",
}
S3_COMPATIBLE_ENV = {
    "AWS_REQUEST_CHECKSUM_CALCULATION": "WHEN_REQUIRED",
    "AWS_RESPONSE_CHECKSUM_VALIDATION": "WHEN_REQUIRED",
}
FETCH_TIMEOUT_SECONDS = 900


class ConnectorMissingError(LakehouseError):
    """A set of jars is not in the cache and could not be fetched."""


def jars_root() -> Path:
    configured = os.environ.get(JARS_DIR_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "lakehouse_assets" / "jars"


def _pom(name: str) -> Path:
    return Path(str(resources.files("lakehouse_assets.jvm") / "maven" / f"{name}.pom.xml"))


def fetch_jars(name: str) -> Path:
    """Copy the jars of set ``name`` into the cache with Maven (once); returns their directory."""
    directory = jars_root() / name
    if (directory / COMPLETE_MARKER).exists():
        return directory
    maven = shutil.which("mvn")
    if maven is None:
        raise ConnectorMissingError(
            f"the {name} jars are not in {directory} and Maven (mvn) is not installed to fetch them: install "
            f"Maven, or copy the jars of {_pom(name)} there"
            + (f", or set spark.jars.packages: {SPARK_KAFKA_PACKAGE} in the spark map" if name == SPARK_KAFKA else "")
        )
    staging = directory.with_name(f".{name}.{uuid.uuid4().hex}")
    command = [maven, "-q", "-B", "-f", str(_pom(name)), "dependency:copy-dependencies"]
    command += [f"-DoutputDirectory={staging}", "-DincludeScope=runtime"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=FETCH_TIMEOUT_SECONDS, check=False)
        if done.returncode != 0:
            output = (done.stdout + done.stderr).strip().splitlines()
            raise ConnectorMissingError(f"Maven could not fetch the {name} jars: {' '.join(output[-3:])}")
        (staging / COMPLETE_MARKER).touch()
        shutil.rmtree(directory, ignore_errors=True)  # what a fetch that died left
        try:
            staging.rename(directory)
        except OSError:
            if not (directory / COMPLETE_MARKER).exists():  # else another process fetched it first
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return directory


def connector_jars(name: str) -> list[str]:
    """The jar files of set ``name``, fetched first if the cache lacks them."""
    return sorted(str(jar) for jar in fetch_jars(name).glob("*.jar"))
