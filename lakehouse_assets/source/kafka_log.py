"""A Kafka stream's topics as the sensor and the writer see them: partitions and their offsets.

The sensor asks the brokers (librdkafka's admin client, no JVM) for each partition's first offset
and its last stable offset, the end a ``read_committed`` reader reaches: records of a transaction
still open, or aborted, are never inside a batch. A batch is a range of offsets per partition;
its records are read by Spark (``ingest/kafka_reader.py``) with the same client settings.

Partitions are named ``<topic>/<partition>`` (topic names cannot hold ``/``). Secrets in the
settings (``${env:NAME}``) are read when a client is made and are never logged or recorded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from lakehouse_assets.config.env_references import resolve_env_references
from lakehouse_assets.config.spec import KafkaSourceSpec, StreamSpec
from lakehouse_assets.errors import LakehouseError

REQUEST_TIMEOUT_SECONDS = 15.0
# How long the broker may hold a fetch that finds no record yet (the Java client's default is 500
# ms). A batch reads offsets that are all in the log already, so a wait only delays the end of each
# partition's read: 400,000 records over 32 partitions read in 6.0 s with the default, 1.2 s with
# 10 ms (docs/benchmarks.md).
FETCH_MAX_WAIT_MS = "10"
INTERNAL_TOPIC_PREFIX = "__"
JAAS_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


class KafkaUnavailableError(LakehouseError):
    """The brokers could not be asked for the topic's partitions or offsets."""


class KafkaRecordsLostError(LakehouseError):
    """Offsets a batch must read were deleted from the log (retention) before they were read."""


@dataclass(frozen=True)
class PartitionLog:
    """What a partition's log holds now: offsets ``first`` up to (not including) ``end``."""

    first: int
    end: int


def partition_name(topic: str, partition: int) -> str:
    return f"{topic}/{partition}"


def split_partition_name(name: str) -> tuple[str, int]:
    topic, _, partition = name.rpartition("/")
    return topic, int(partition)


def _resolved(value: str | None, where: str) -> str | None:
    return resolve_env_references(value, where) if value is not None else None


def client_settings(stream: StreamSpec) -> dict[str, str]:
    """librdkafka settings of the stream's source: brokers and security, secrets resolved."""
    source = _source(stream)
    security = source.security
    where = f"stream {stream.name!r}: source.kafka.security"
    settings = {
        "bootstrap.servers": resolve_env_references(source.bootstrap_servers, f"stream {stream.name!r}: bootstrap"),
        "security.protocol": security.protocol,
    }
    optional = {
        "sasl.mechanism": security.sasl_mechanism,
        "sasl.username": _resolved(security.sasl_username, f"{where}.sasl_username"),
        "sasl.password": _resolved(security.sasl_password, f"{where}.sasl_password"),
        "ssl.ca.location": security.ssl_ca_location,
    }
    return settings | {key: value for key, value in optional.items() if value is not None}


def spark_options(stream: StreamSpec) -> dict[str, str]:
    """Options of Spark's Kafka source for the stream: the same brokers and security in the Java
    client's names, ``read_committed``, fetches that do not wait for records (``FETCH_MAX_WAIT_MS``),
    then ``source.kafka.properties``."""
    source = _source(stream)
    security = source.security
    settings = client_settings(stream)
    options = {
        "kafka.bootstrap.servers": settings["bootstrap.servers"],
        "kafka.security.protocol": security.protocol,
        "kafka.isolation.level": "read_committed",
        "kafka.fetch.max.wait.ms": FETCH_MAX_WAIT_MS,
    }
    if security.sasl_mechanism:
        username, password = settings["sasl.username"], settings["sasl.password"]
        options["kafka.sasl.mechanism"] = security.sasl_mechanism
        options["kafka.sasl.jaas.config"] = (
            f'{JAAS_MODULES[security.sasl_mechanism]} required username="{_jaas_quoted(username)}" '
            f'password="{_jaas_quoted(password)}";'
        )
    if security.ssl_ca_location:
        options["kafka.ssl.truststore.type"] = "PEM"
        options["kafka.ssl.truststore.location"] = security.ssl_ca_location
    for key, value in source.properties.items():
        where = f"stream {stream.name!r}: source.kafka.properties.{key}"
        options[f"kafka.{key}"] = resolve_env_references(value, where)
    return options


def _jaas_quoted(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _source(stream: StreamSpec) -> KafkaSourceSpec:
    if stream.kafka_source is None:
        raise LakehouseError(f"stream {stream.name!r} has no Kafka source")
    return stream.kafka_source


class KafkaLog:
    """The brokers of one Kafka stream, asked through one admin client."""

    def __init__(self, stream: StreamSpec) -> None:
        self.stream = stream
        self.source = _source(stream)
        self.admin = AdminClient(dict[str, str | int | float | bool](client_settings(stream)))

    def _failure(self, doing: str, error: BaseException) -> KafkaUnavailableError:
        return KafkaUnavailableError(
            f"stream {self.stream.name!r}: could not {doing} from Kafka at {self.source.bootstrap_servers}: {error}"
        )

    def topics(self) -> dict[str, list[int]]:
        """The stream's topics with their partitions, in order; a topic not created yet has none."""
        try:
            metadata = self.admin.list_topics(timeout=REQUEST_TIMEOUT_SECONDS)
        except KafkaException as error:
            raise self._failure("list the topics", error) from None
        if self.source.topic is not None:
            names = [self.source.topic]
        else:
            pattern = re.compile(self.source.topic_pattern or "")
            names = [name for name in metadata.topics if pattern.fullmatch(name)]
        found = {}
        for name in sorted(names):
            topic = metadata.topics.get(name)
            if topic is None or topic.error is not None or name.startswith(INTERNAL_TOPIC_PREFIX):
                continue
            found[name] = sorted(topic.partitions)
        return found

    def partitions(self) -> dict[str, PartitionLog]:
        """Every partition of the stream's topics with its first offset and last stable offset."""
        wanted = [TopicPartition(topic, p) for topic, parts in self.topics().items() for p in parts]
        if not wanted:
            return {}
        first = self._offsets(wanted, OffsetSpec.earliest())
        end = self._offsets(wanted, OffsetSpec.latest())
        return {name: PartitionLog(first[name], end[name]) for name in sorted(end, key=split_partition_name)}

    def _offsets(self, partitions: list[TopicPartition], spec: OffsetSpec) -> dict[str, int]:
        request = {partition: spec for partition in partitions}
        try:
            futures = self.admin.list_offsets(
                request, isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=REQUEST_TIMEOUT_SECONDS
            )
            return {
                partition_name(partition.topic, partition.partition): future.result().offset
                for partition, future in futures.items()
            }
        except KafkaException as error:
            raise self._failure("read the partitions' offsets", error) from None


def lost_offsets(ranges: dict[str, list[int]], log: dict[str, PartitionLog]) -> dict[str, list[int]]:
    """The ``[start, end)`` of each range whose first offsets the log no longer holds: deleted
    (retention, or records deleted by hand) before the stream read them."""
    lost = {}
    for name, (start, end) in ranges.items():
        first = log[name].first if name in log else None
        if end > start and first is not None and first > start:
            lost[name] = [start, min(first, end)]
    return lost


def describe_lost(lost: dict[str, list[int]]) -> str:
    return "; ".join(f"partition {name} offsets {start}-{end - 1}" for name, (start, end) in lost.items())


def records_lost_error(stream: StreamSpec, sequence: int, lost: dict[str, list[int]]) -> KafkaRecordsLostError:
    """The error of a batch whose offsets were deleted before it was read, naming each range."""
    return KafkaRecordsLostError(
        f"stream {stream.name!r}: batch {sequence}: {describe_lost(lost)} were deleted from Kafka (retention) "
        "before they were read, so they cannot reach the table. Raise the topic's retention.ms above the "
        "pipeline's longest stop; to go on without them set source.kafka.on_records_lost: skip (the commit "
        "records the lost ranges in lakehouse.kafka-lost-offsets)"
    )
