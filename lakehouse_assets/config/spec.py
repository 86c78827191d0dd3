"""The pipeline configuration (`lakehouse.yaml`), validated once when it is loaded.

Key names follow the Iceberg sink RFC's configuration reference. Every error names the stream and
the key, for example ``stream 'orders': flush.max_age: invalid duration '5 minutes'``.
"""

from __future__ import annotations

import difflib
import functools
import re
import typing
from collections.abc import Mapping
from datetime import date
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator

from lakehouse_assets.catalog.catalogs import HADOOP, catalog_type, check_catalog
from lakehouse_assets.catalog.iceberg_types import IcebergType, parse_type, type_name
from lakehouse_assets.errors import ConfigError

PARTITION_TRANSFORM = re.compile(r"^(identity|year|month|day|hour|bucket\[\d+\]|truncate\[\d+\])$")
DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d)$")
DURATION_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
IDENTIFIER_PART = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
STREAM_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
OPERATION_POINTER = re.compile(r"^\$\{(/[A-Za-z0-9_]+)+\}$")
TEMPLATE_POINTER = re.compile(r"\$\{((?:/[A-Za-z0-9_]+)+)\}")
ROUTER_DEAD_LETTER_NAMESPACE = "lakehouse"
SOURCE_POSITION_COLUMN = "_lakehouse_source_position"
"""The column of a Debezium stream's table that keeps each row's source position."""
SOURCE_POSITION_TYPE = "struct<lsn: decimal(38,0), file: string, pos: decimal(38,0), row: long>"
"""Postgres ``source.lsn``, or MySQL ``source.file``/``pos``/``row``, compared in that order."""
ORDERED_TYPES = ("int", "long", "float", "double", "date", "timestamp", "timestamptz", "string")
SYSTEM_COLUMN_PREFIX = "_lakehouse_"
ICEBERG_SOURCE_OPERATION = "${/bulk_action}"
OPERATION_NAMES = {"index", "insert", "create", "c", "i", "r", "update", "u", "delete", "d"}
MAX_LANDING_FILE_BYTES = 64 * 1024 * 1024
"""Landing files are at most this large (``lakehouse ingest`` splits larger input)."""


def parse_duration(value: str | int | float) -> float:
    """Seconds in a duration such as ``250ms``, ``0s``, ``60s``, ``5m``, ``1h`` or a number of seconds."""
    if isinstance(value, (int, float)):
        return float(value)
    match = DURATION.fullmatch(str(value).strip())
    if not match:
        raise ValueError(f"invalid duration {value!r} (use e.g. 500ms, 30s, 5m, 1h)")
    return float(match.group(1)) * DURATION_UNIT_SECONDS[match.group(2)]


Duration = Annotated[float, BeforeValidator(parse_duration)]
"""Seconds, written as a duration such as ``30s``, ``5m`` or ``7d``."""


def _as_strings(value: Any) -> Any:
    """A mapping's keys and values as text (YAML reads ``true`` or ``2`` as other types)."""
    if isinstance(value, dict):
        return {str(key): str(item) for key, item in value.items()}
    return value


StringMap = Annotated[dict[str, str], BeforeValidator(_as_strings)]
"""Properties passed on as text: catalog and Spark settings, table properties."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ColumnSpec(_Strict):
    """One declared column: an Iceberg type name and whether it is required."""

    name: str
    type: str
    required: bool = False

    @field_validator("type")
    @classmethod
    def _known_type(cls, value: str) -> str:
        return type_name(parse_type(value))

    @property
    def iceberg_type(self) -> IcebergType:
        return parse_type(self.type)


class PartitionFieldSpec(_Strict):
    """One partition field: a source column and an Iceberg transform."""

    column: str
    transform: str = "identity"

    @field_validator("transform")
    @classmethod
    def _known_transform(cls, value: str) -> str:
        if not PARTITION_TRANSFORM.fullmatch(value):
            raise ValueError(
                f"unsupported transform {value!r}; use identity, year, month, day, hour, bucket[N] or truncate[W]"
            )
        return value


class SchemaEvolutionSpec(_Strict):
    """``schema_evolution: {relax_required: true}``: schema evolution as with ``true``, and a
    required column (not an identifier column) that the events stop carrying becomes optional
    instead of every such event going to the dead letters."""

    relax_required: bool = False


class SchemaSpec(_Strict):
    """Columns and partitioning used when the stream creates its table."""

    columns: list[ColumnSpec] = Field(default_factory=list)
    partition_spec: list[PartitionFieldSpec] = Field(default_factory=list)

    @model_validator(mode="after")
    def _partition_columns_exist(self) -> SchemaSpec:
        names = [column.name for column in self.columns]
        # Spark resolves column names without case: `a` and `A` would be one ambiguous column.
        folded = [name.lower() for name in names]
        duplicates = sorted({name for name in names if folded.count(name.lower()) > 1})
        if duplicates:
            raise ValueError(f"duplicate column names (case is ignored): {', '.join(duplicates)}")
        for field in self.partition_spec:
            if field.column not in names:
                raise ValueError(f"partition_spec names column {field.column!r}, which is not declared")
        return self


class FlushSpec(_Strict):
    """The micro-batch trigger: whichever of size and age is reached first."""

    max_bytes: int = Field(default=128 * 1024 * 1024, gt=0)
    max_age: Duration = 60.0


class CompactionSpec(_Strict):
    """``rewrite_data_files`` and ``rewrite_position_delete_files`` options."""

    enabled: bool = True
    min_input_files: int = Field(default=5, gt=0)
    """Rewrite a file group once it has this many files."""
    delete_file_threshold: int = Field(default=1, gt=0)
    """Rewrite a data file once this many delete files apply to it (merge-on-read tables)."""
    target_file_size_bytes: int = Field(default=128 * 1024 * 1024, gt=0)


class ExpirySpec(_Strict):
    """``expire_snapshots``: snapshots older than ``older_than`` go, except the last ``retain_last``.

    A checkpoint of every stream's committed sequence is recorded first, so recovery never needs
    an expired snapshot.
    """

    enabled: bool = True
    older_than: Duration = 86400.0
    retain_last: int = Field(default=10, ge=1)


class OrphanFilesSpec(_Strict):
    """``remove_orphan_files``: unreferenced files in the table's location older than ``older_than``."""

    enabled: bool = True
    older_than: Duration = Field(default=3 * 86400.0, gt=0)
    """The grace period; keep it longer than any commit of any writer of the table."""


class MaintenanceSpec(_Strict):
    """Table maintenance, run by the table's maintenance job on ``schedule`` or on demand."""

    schedule: str | None = "0 * * * *"
    """Cron schedule of the maintenance job; null runs it only on demand."""
    compaction: CompactionSpec = Field(default_factory=CompactionSpec)
    expire_snapshots: ExpirySpec = Field(default_factory=ExpirySpec)
    remove_orphan_files: OrphanFilesSpec = Field(default_factory=OrphanFilesSpec)
    rewrite_manifests: bool = True
    landing_retention: Duration = 7 * 86400.0
    """Committed landing files are removed this long after their commit, once no retained
    snapshot could be rolled back to before it."""


class CompletenessSpec(_Strict):
    """Event-time completeness: the watermark is the largest committed event time minus
    ``allowed_lateness``; a day is complete once the watermark passes its end (UTC)."""

    allowed_lateness: Duration = 0.0
    start_date: date
    """The first day the completeness signal has a partition for."""


class LandingHttpSpec(_Strict):
    """Events POSTed to ``lakehouse serve`` for the stream, landed as its landing files."""

    tokens: list[str] = Field(min_length=1)
    """Bearer tokens allowed to post to this stream; write them ``${env:NAME}``."""


class LandingSourceSpec(_Strict):
    """Append-only NDJSON files in a directory; defaults to ``$LAKEHOUSE_HOME/landing/<stream>``."""

    path: str | None = None
    format: Literal["json", "debezium"] = "json"
    """``json``: each line is the row; ``debezium``: each line is a Debezium change envelope."""
    http: LandingHttpSpec | None = None
    """Also accept the stream's events over HTTP (``lakehouse serve``); without it the server
    answers 404 for the stream."""


class IcebergSourceSpec(_Strict):
    """An Iceberg table whose changes the stream applies (the CDC source RFC), in catalog ``lake``
    or in its own ``catalog``."""

    table: str
    identifier_columns: list[str] | None = None
    """The source's key: changes become one upsert or delete per key and snapshot, and the
    downstream table gets them as its identifier columns. Without it only appends can be synced."""
    disable_export: bool = False
    """Start from the source's current snapshot without the initial full load."""
    polling_interval: Duration = Field(default=30.0, gt=0)
    catalog: StringMap | None = None
    """The source's catalog properties when it is not catalog ``lake`` (same keys as the top-level
    ``catalog``); Spark sees it as catalog ``source_<stream>``."""

    @field_validator("catalog")
    @classmethod
    def _hadoop_catalog_has_warehouse(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is not None and catalog_type(value) == HADOOP and "warehouse" not in value:
            raise ValueError("a hadoop catalog needs its warehouse: catalog: {type: hadoop, warehouse: ...}")
        return value

    @field_validator("table")
    @classmethod
    def _table_identifier(cls, value: str) -> str:
        if not is_table_identifier(value):
            raise ValueError(f"{value!r} is not of the form namespace.table")
        return value


KAFKA_METADATA = ("topic", "partition", "offset", "timestamp", "key", "headers")
"""What of a Kafka record a stream may keep as a column (``source.kafka.metadata_columns``)."""
KAFKA_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


class KafkaSecuritySpec(_Strict):
    """How the clients authenticate to the brokers; given to both Kafka clients (the sensor's
    librdkafka and Spark's Java client). Write secrets ``${env:NAME}``: they are read when a client
    is made and never logged."""

    protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_username: str | None = None
    sasl_password: str | None = None
    ssl_ca_location: str | None = None
    """A PEM file of the certificate authorities the brokers' certificates are checked against."""

    @model_validator(mode="after")
    def _sasl_has_credentials(self) -> KafkaSecuritySpec:
        if self.protocol.startswith("SASL") and not (self.sasl_mechanism and self.sasl_username and self.sasl_password):
            raise ValueError(f"protocol {self.protocol} needs sasl_mechanism, sasl_username and sasl_password")
        return self


class KafkaSourceSpec(_Strict):
    """A Kafka topic (or every topic matching ``topic_pattern``) read by offset range: each batch is
    a range per partition, and each commit records the offsets it reached in the table."""

    bootstrap_servers: str
    topic: str | None = None
    topic_pattern: str | None = None
    """A Java regular expression over topic names (``orders\\..*``); topics that appear later are
    picked up from their first offset."""
    format: Literal["json", "debezium"] = "json"
    """``json``: each record's value is the row; ``debezium``: a Debezium change envelope."""
    metadata_columns: dict[str, str] = Field(default_factory=dict)
    """Columns filled from the record rather than its value: column name -> one of topic,
    partition, offset, timestamp, key, headers (headers as a JSON object of text)."""
    on_records_lost: Literal["fail", "skip"] = "fail"
    """Offsets deleted from the log (retention) before the stream read them: ``fail`` the batch
    with an error naming each partition and range, or ``skip`` them, recording the lost ranges in
    the commit's summary (``lakehouse.kafka-lost-offsets``) and the batch's metadata."""
    max_records: int = Field(default=5_000_000, gt=0)
    """A batch takes at most this many offsets (spread over the partitions by their lag)."""
    security: KafkaSecuritySpec = Field(default_factory=KafkaSecuritySpec)
    properties: StringMap = Field(default_factory=dict)
    """Further settings of Spark's Kafka consumer (Java client names, e.g. ``fetch.max.bytes``)."""

    @model_validator(mode="after")
    def _one_topic_selector(self) -> KafkaSourceSpec:
        if (self.topic is None) == (self.topic_pattern is None):
            raise ValueError("name the topic or the topics: set exactly one of topic and topic_pattern")
        if self.topic is not None and not KAFKA_TOPIC.fullmatch(self.topic):
            raise ValueError(f"topic {self.topic!r} is not a Kafka topic name (letters, digits, '.', '_', '-')")
        if self.topic_pattern is not None:
            try:
                re.compile(self.topic_pattern)
            except re.error as error:
                raise ValueError(f"topic_pattern {self.topic_pattern!r}: {error}") from None
        for column, field in self.metadata_columns.items():
            if field not in KAFKA_METADATA:
                raise ValueError(f"metadata_columns: {column!r}: {field!r} is not one of {', '.join(KAFKA_METADATA)}")
            if not IDENTIFIER_PART.fullmatch(column):
                raise ValueError(f"metadata_columns: {column!r} is not a column name (letters, digits and _)")
        return self


class SourceSpec(_Strict):
    landing: LandingSourceSpec | None = None
    iceberg: IcebergSourceSpec | None = None
    kafka: KafkaSourceSpec | None = None

    @model_validator(mode="after")
    def _one_source(self) -> SourceSpec:
        if sum(source is not None for source in (self.landing, self.iceberg, self.kafka)) != 1:
            raise ValueError(
                "a stream needs exactly one source: source: {landing: {}}, source: {iceberg: {table: ...}} "
                "or source: {kafka: {bootstrap_servers: ..., topic: ...}}"
            )
        return self


class ExpectationSpec(_Strict):
    """A condition every row of the table must meet, as a SQL boolean over its columns."""

    name: str
    condition: str
    """SQL that DuckDB (the check) and Spark (``on_failure: dead_letter``) both read, e.g.
    ``amount >= 0`` or ``status IN ('open', 'closed')``; NULL counts as not met."""
    on_failure: Literal["block", "dead_letter"] = "block"
    """``block``: a blocking check on each commit fails (with ``publish: audit``, main is not
    published); ``dead_letter``: events whose row does not meet it are dead letters when staged."""

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not IDENTIFIER_PART.fullmatch(value):
            raise ValueError(f"expectation name {value!r}: use letters, digits and _")
        return value


class StreamSpec(_Strict):
    """One event stream and the Iceberg table it writes."""

    name: str
    source: SourceSpec = Field(default_factory=lambda: SourceSpec(landing=LandingSourceSpec()))
    table_identifier: str
    operation: str | None = None
    identifier_columns: list[str] | None = None
    auto_create: bool = False
    schema_evolution: bool | SchemaEvolutionSpec = False
    table_schema: SchemaSpec = Field(default_factory=SchemaSpec, alias="schema")
    table_properties: StringMap = Field(default_factory=dict)
    table_location: str | None = None
    flush: FlushSpec = Field(default_factory=FlushSpec)
    commit_interval: Duration = 300.0
    event_time_column: str | None = None
    version_column: str | None = None
    """A change stream's ordering column (e.g. ``updated_at`` or ``version``): a change whose value
    is older than the row's committed one never updates or deletes it, and within a batch a key's
    newest version wins. Debezium streams order by their source position without it."""
    maintenance: MaintenanceSpec = Field(default_factory=MaintenanceSpec)
    completeness: CompletenessSpec | None = None
    max_lag: Duration = Field(default=1800.0, gt=0)
    """The freshness check fails when the oldest uncommitted event is older than this."""
    max_uncommitted_bytes: int = Field(default=1024 * 1024 * 1024, gt=0)
    """Backpressure: no new batch is cut while minted or staged but uncommitted batches hold this
    many landing bytes; landing keeps accepting events."""
    publish: Literal["direct", "audit"] = "direct"
    """``direct``: each commit is visible to readers at once; ``audit``: commits land on the
    table's ``audit`` branch and main is fast-forwarded to them only once every blocking check passed."""
    expectations: list[ExpectationSpec] = Field(default_factory=list)
    routed_from: str | None = None
    """Set on the streams that dynamic routing derives (one per resolved table); not a config key."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @property
    def relaxes_required(self) -> bool:
        """Whether required columns the events stop carrying become optional (schema evolution)."""
        return isinstance(self.schema_evolution, SchemaEvolutionSpec) and self.schema_evolution.relax_required

    @field_validator("name")
    @classmethod
    def _stream_name(cls, value: str) -> str:
        if not STREAM_NAME.fullmatch(value):
            raise ValueError(f"invalid stream name {value!r}: use lower case letters, digits and _")
        return value

    @field_validator("expectations")
    @classmethod
    def _unique_expectations(cls, value: list[ExpectationSpec]) -> list[ExpectationSpec]:
        names = [expectation.name for expectation in value]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"duplicate expectation names: {', '.join(duplicates)}")
        return value

    @field_validator("table_identifier")
    @classmethod
    def _identifier_or_template(cls, value: str) -> str:
        if "${" in value:
            if not TEMPLATE_POINTER.search(value) or "${" in TEMPLATE_POINTER.sub("", value):
                raise ValueError(
                    f"{value!r} is not a table expression; use JSON pointers such as '${{/source/table}}' "
                    "or 'sales.${/table}'"
                )
            return value
        if not is_table_identifier(value):
            raise ValueError(f"{value!r} is not of the form namespace.table")
        return value

    @field_validator("operation")
    @classmethod
    def _operation_expression(cls, value: str | None) -> str | None:
        if value is None:
            return value
        match = OPERATION_POINTER.fullmatch(value)
        if match is None and "${" in value:
            raise ValueError(f"{value!r} is not a JSON pointer expression such as '${{/op}}'")
        if match is None and value.strip().lower() not in OPERATION_NAMES:
            raise ValueError(f"constant operation {value!r} is not one of {', '.join(sorted(OPERATION_NAMES))}")
        return value

    @model_validator(mode="before")
    @classmethod
    def _iceberg_source_applies_its_changes(cls, raw: Any) -> Any:
        """A stream from an Iceberg source applies the source's changes by its key: the events'
        ``bulk_action`` is the operation and the source's identifier columns are the stream's."""
        source = raw.get("source") if isinstance(raw, dict) else None
        iceberg = source.get("iceberg") if isinstance(source, dict) else None
        if not isinstance(iceberg, dict) or not iceberg.get("identifier_columns"):
            return raw
        if raw.get("operation") is not None or raw.get("identifier_columns") is not None:
            raise ValueError(
                "operation and identifier_columns come from source.iceberg (its identifier_columns); remove them"
            )
        return {**raw, "operation": ICEBERG_SOURCE_OPERATION, "identifier_columns": iceberg["identifier_columns"]}

    @model_validator(mode="after")
    def _routing_infers_each_schema(self) -> StreamSpec:
        if not self.is_router:
            return self
        if self.table_schema.columns:
            raise ValueError(
                "schema.columns: a dynamic table_identifier routes to tables with different schemas; "
                "remove schema.columns (each table's schema is inferred from its first batch)"
            )
        if self.table_location:
            raise ValueError("table_location: a dynamic table_identifier routes to several tables; remove it")
        if self.source.iceberg:
            raise ValueError("table_identifier: a stream from an Iceberg source writes one table; name it")
        if self.source.kafka:
            raise ValueError("table_identifier: routing by event is for landing streams; name the Kafka stream's table")
        return self

    @model_validator(mode="after")
    def _event_time_column_declared(self) -> StreamSpec:
        columns = {column.name: column for column in self.table_schema.columns}
        if self.event_time_column is not None and columns:
            if columns.get(self.event_time_column) is None or columns[self.event_time_column].type not in (
                "timestamp",
                "timestamptz",
            ):
                raise ValueError(f"event_time_column: {self.event_time_column!r} is not a declared timestamp column")
        return self

    @model_validator(mode="after")
    def _completeness_needs_event_time(self) -> StreamSpec:
        if self.completeness is not None and self.resolved_event_time_column() is None:
            raise ValueError("completeness: needs a timestamp column (event_time_column, or one in schema.columns)")
        return self

    @model_validator(mode="after")
    def _changes_need_identifier_columns(self) -> StreamSpec:
        if self.is_debezium and self.operation is not None:
            raise ValueError("operation: a Debezium stream takes each event's operation from its envelope's 'op'")
        if not self.applies_changes:
            if self.identifier_columns:
                raise ValueError("identifier_columns: only used with operation or format: debezium")
            return self
        if not self.identifier_columns and self.auto_create:
            raise ValueError(
                "identifier_columns: required when the stream applies changes and creates its table "
                "(an existing table's identifier fields are used otherwise)"
            )
        columns = {column.name: column for column in self.table_schema.columns}
        for name in self.identifier_columns or []:
            if columns and name not in columns:
                raise ValueError(f"identifier_columns: {name!r} is not a declared column")
            if columns and not columns[name].required:
                raise ValueError(f"identifier_columns: {name!r} must be declared with required: true")
        if self.version_column and columns and columns.get(self.version_column) is None:
            raise ValueError(f"version_column: {self.version_column!r} is not a declared column")
        if self.version_column and columns and columns[self.version_column].type not in ORDERED_TYPES:
            raise ValueError(f"version_column: {self.version_column!r} must be one of {', '.join(ORDERED_TYPES)}")
        return self

    @model_validator(mode="after")
    def _version_needs_changes(self) -> StreamSpec:
        if self.version_column and not self.applies_changes:
            raise ValueError("version_column: only used by streams that apply changes (operation or format: debezium)")
        return self

    @property
    def order_column(self) -> str | None:
        """The table column that orders a key's changes across batches: ``version_column``, else a
        Debezium stream's source position (``_lakehouse_source_position``), else none."""
        if self.version_column:
            return self.version_column
        return SOURCE_POSITION_COLUMN if self.is_debezium else None

    @property
    def iceberg_source(self) -> IcebergSourceSpec | None:
        return self.source.iceberg

    @property
    def source_table(self) -> IcebergSourceSpec:
        """The Iceberg source of a stream that has one (``source.iceberg``); an error otherwise."""
        if self.source.iceberg is None:
            raise ConfigError(f"stream {self.name!r} has no Iceberg source")
        return self.source.iceberg

    @property
    def source_catalog_name(self) -> str:
        """The Spark catalog of the Iceberg source: ``lake``, or ``source_<stream>`` for its own catalog."""
        return f"source_{self.name}" if self.iceberg_source and self.iceberg_source.catalog else "lake"

    @property
    def kafka_source(self) -> KafkaSourceSpec | None:
        return self.source.kafka

    @property
    def is_debezium(self) -> bool:
        source = self.source.landing or self.source.kafka
        return source is not None and source.format == "debezium"

    @property
    def applies_changes(self) -> bool:
        """True when events carry INSERT/UPDATE/DELETE operations applied per key (``commit/row_deltas.py``)."""
        return self.operation is not None or self.is_debezium

    @property
    def is_router(self) -> bool:
        """True when ``table_identifier`` is an expression: the stream routes each event to a table."""
        return "${" in self.table_identifier

    @property
    def router_dead_letter_identifier(self) -> str:
        """Where a router puts the events it cannot route: ``lakehouse.<stream>_dead_letters``."""
        return f"{ROUTER_DEAD_LETTER_NAMESPACE}.{self.name}_dead_letters"

    @property
    def namespace(self) -> str:
        return self.table_identifier.rsplit(".", 1)[0]

    @property
    def table_name(self) -> str:
        return self.table_identifier.rsplit(".", 1)[1]

    def resolved_event_time_column(self) -> str | None:
        """The column whose maximum is the batch's event time: configured, else the first timestamp."""
        if self.event_time_column:
            return self.event_time_column
        for column in self.table_schema.columns:
            if column.type in ("timestamp", "timestamptz"):
                return column.name
        return None


class SparkHostSpec(_Strict):
    """The Spark host: one warm Spark driver shared by the Dagster runs of a lakehouse home
    (``lakehouse_assets.engine.spark_host``), instead of a Spark JVM started by every run."""

    enabled: bool = True
    idle_timeout: Duration = Field(default=600.0, gt=0)
    """The host exits after this long without a call; the next landing sensor tick that sees events
    pending (``start_early``), or else the next run, starts it again."""
    start_early: bool = True
    """A landing sensor that sees events pending starts the host at once (without waiting for it),
    so its JVM starts while the batch fills and its run is queued; false: the first run that needs
    the host starts it."""
    call_timeout: Duration = Field(default=3600.0, gt=0)
    """A call the host has not answered after this long is taken for a hung host: the host is
    killed (as a crash at that point, which every call survives) and the run fails, to be run again."""


class HttpServerSpec(_Strict):
    """``lakehouse serve``: the HTTP endpoint that lands the events producers POST."""

    host: str = "127.0.0.1"
    """The address to listen on; ``0.0.0.0`` for every interface (behind TLS: see docs/http.md)."""
    port: int = Field(default=8080, gt=0, lt=65536)
    max_request_bytes: int = Field(default=16 * 1024 * 1024, gt=0)
    """A body larger than this, as sent (compressed or not), is refused with 413."""
    max_events_bytes: int = Field(default=MAX_LANDING_FILE_BYTES, gt=0, le=MAX_LANDING_FILE_BYTES)
    """A body larger than this once decompressed is refused with 413 (a request lands in one file)."""
    body_timeout: Duration = Field(default=30.0, gt=0)
    """A client that has not sent its whole body after this long gets 408."""
    idempotency_window: Duration = Field(default=86400.0, gt=0)
    """How long an ``Idempotency-Key`` is remembered (across restarts of the server)."""
    max_pending_bytes: int = Field(default=1024 * 1024 * 1024, gt=0)
    """Backpressure: while a stream's landed bytes not committed yet pass this, its requests get
    503 with ``Retry-After``, so a stopped pipeline cannot fill the disk."""


class StorageSpec(_Strict):
    """The storage root's headroom (``batches/headroom.py``)."""

    min_free_bytes: int = Field(default=256 * 1024 * 1024, ge=0)
    """Producers (``lakehouse ingest``, ``lakehouse serve``: 503) are refused while the storage root,
    or Spark's scratch directory when it is on another file system, has less free than this plus
    half the landed bytes not committed yet, so the pipeline can always
    commit what has landed. The default is twice the default ``flush.max_bytes``: Spark's scratch for
    one batch, the metadata and the Dagster instance."""


class LakehouseConfig(_Strict):
    """The whole pipeline: catalog properties for catalog ``lake`` and the streams."""

    catalog: StringMap = Field(default_factory=lambda: {"type": "hadoop"})
    spark: StringMap = Field(default_factory=dict)
    spark_host: SparkHostSpec = Field(default_factory=SparkHostSpec)
    http: HttpServerSpec = Field(default_factory=HttpServerSpec)
    storage: StorageSpec = Field(default_factory=StorageSpec)
    streams: list[StreamSpec]

    @field_validator("catalog")
    @classmethod
    def _catalog_both_clients_read(cls, value: dict[str, str]) -> dict[str, str]:
        try:
            check_catalog(value)
        except ConfigError as error:
            raise ValueError(str(error).removeprefix("catalog: ")) from error
        return value

    @model_validator(mode="before")
    @classmethod
    def _no_routed_from(cls, raw: Any) -> Any:
        for stream in (raw.get("streams") or []) if isinstance(raw, dict) else []:
            if isinstance(stream, dict) and "routed_from" in stream:
                raise ValueError(f"stream {stream.get('name')!r}: routed_from: set by routing, not a configuration key")
        return raw

    @model_validator(mode="after")
    def _unique_streams(self) -> LakehouseConfig:
        names = [stream.name for stream in self.streams]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"duplicate stream names: {', '.join(duplicates)}")
        if not self.streams:
            raise ValueError("streams: declare at least one stream")
        placed = [stream.name for stream in self.streams if stream.table_location]
        if placed and catalog_type(self.catalog) == HADOOP:
            raise ValueError(
                f"streams {', '.join(placed)}: table_location: the hadoop catalog keeps each table at "
                "<warehouse>/<namespace>/<table>; use another catalog type to place tables elsewhere"
            )
        for table, streams in self.tables.items():
            if len({stream.publish for stream in streams}) > 1:
                raise ValueError(
                    f"streams {', '.join(s.name for s in streams)} write {table} with different publish modes; "
                    "a table is published one way, so give them the same"
                )
            if len({stream.maintenance.model_dump_json(exclude={"landing_retention"}) for stream in streams}) > 1:
                raise ValueError(
                    f"streams {', '.join(s.name for s in streams)} write {table} with different maintenance "
                    "settings; a table is maintained once, so give them the same (landing_retention may differ)"
                )
        return self

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> LakehouseConfig:
        """A copy with ``update``, its derived maps (``tables``) computed again: pydantic copies the
        instance's dictionary, cached properties included."""
        copied = super().model_copy(update=update, deep=deep)
        copied.__dict__.pop("tables", None)
        return copied

    def stream(self, name: str) -> StreamSpec:
        """The stream called ``name``; a ConfigError lists the known streams otherwise."""
        for stream in self.streams:
            if stream.name == name:
                return stream
        known = ", ".join(stream.name for stream in self.streams)
        raise ConfigError(f"unknown stream {name!r}; configured streams: {known}")

    def source_catalog(self, stream: StreamSpec) -> LakehouseConfig:
        """This configuration with the catalog an Iceberg source stream reads its source from."""
        source = stream.iceberg_source
        return self.model_copy(update={"catalog": source.catalog}) if source and source.catalog else self

    def maintenance(self, table_identifier: str) -> MaintenanceSpec:
        """The table's maintenance settings (its streams agree on them)."""
        return self.tables[table_identifier][0].maintenance

    def audits(self, table_identifier: str) -> bool:
        """True when the table's commits go to its audit branch before they are published."""
        return self.tables[table_identifier][0].publish == "audit"

    @functools.cached_property
    def tables(self) -> dict[str, list[StreamSpec]]:
        """Each target table identifier with the streams that write it (routers write none
        themselves); computed once per configuration."""
        by_table: dict[str, list[StreamSpec]] = {}
        for stream in self.streams:
            if not stream.is_router:
                by_table.setdefault(stream.table_identifier, []).append(stream)
        return by_table

    def routers(self) -> list[StreamSpec]:
        """The streams whose ``table_identifier`` is an expression."""
        return [stream for stream in self.streams if stream.is_router]

    def routed_tables(self, router: str) -> dict[str, list[StreamSpec]]:
        """The tables whose committer is ``router``'s (see ``router_of``), with their derived streams."""
        return {table: streams for table, streams in self.tables.items() if _driving_router(streams) == router}

    def router_of(self, table_identifier: str) -> str | None:
        """The router whose one committer drives ``table_identifier`` with all its other tables: the
        table is written only by that router's derived streams, published directly. A table that
        another stream or router also writes, or that is audited, keeps a committer of its own."""
        return _driving_router(self.tables[table_identifier])


def _driving_router(streams: list[StreamSpec]) -> str | None:
    routers = {stream.routed_from for stream in streams}
    if len(routers) != 1 or None in routers or streams[0].publish == "audit":
        return None
    return routers.pop()


def is_table_identifier(value: str) -> bool:
    """True for ``namespace.table`` (or deeper namespaces) made of identifier parts."""
    parts = value.split(".")
    return len(parts) >= 2 and all(IDENTIFIER_PART.fullmatch(part) for part in parts)


def _describe_error(raw: Any, error: dict[str, Any]) -> str:
    """One problem as ``stream 'name': key.path: message``; list items by their ``name`` (or
    ``column``) where they have one, and an unknown key with the known key it most resembles."""
    location = list(error["loc"])
    prefix = ""
    node = raw
    if len(location) >= 2 and location[0] == "streams" and isinstance(location[1], int):
        streams = raw.get("streams") if isinstance(raw, dict) else None
        node = streams[location[1]] if isinstance(streams, list) and location[1] < len(streams) else None
        name = node.get("name") if isinstance(node, dict) else None
        prefix = f"stream {name!r}: " if name else f"stream #{location[1] + 1}: "
        location = location[2:]
    key = ""
    for part in location:
        if str(part).startswith("function-"):
            continue
        if isinstance(part, int):
            element = node[part] if isinstance(node, list) and part < len(node) else None
            label = next((element[k] for k in ("name", "column") if isinstance(element, dict) and k in element), None)
            key += f"[{label}]" if isinstance(label, str) else f"[{part}]"
            node = element
        else:
            key += f".{part}" if key else str(part)
            node = node.get(part) if isinstance(node, dict) else None
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        message = "unknown key"
        close = difflib.get_close_matches(str(location[-1]), _known_keys(), n=1, cutoff=0.7)
        if close:
            message += f"; did you mean {close[0]!r}?"
    return f"{prefix}{key + ': ' if key else ''}{message}"


@functools.cache
def _known_keys() -> tuple[str, ...]:
    """Every key of the configuration's models (field names and aliases)."""
    keys: set[str] = set()
    pending: list[type[BaseModel]] = [LakehouseConfig]
    seen: set[type[BaseModel]] = set()
    while pending:
        model = pending.pop()
        if model in seen:
            continue
        seen.add(model)
        for name, field in model.model_fields.items():
            keys.update(filter(None, (name, field.alias)))
            for argument in _types_in(field.annotation):
                if isinstance(argument, type) and issubclass(argument, BaseModel):
                    pending.append(argument)
    return tuple(sorted(keys))


def _types_in(annotation: Any) -> list[Any]:
    """``annotation`` and every type argument in it (``list[X] | None`` gives X)."""
    found = [annotation]
    for argument in typing.get_args(annotation):
        found += _types_in(argument)
    return found


def parse_config(raw: Any, origin: str = "<config>") -> LakehouseConfig:
    """Validate a parsed YAML document; raises ConfigError naming each bad stream and key."""
    try:
        return LakehouseConfig.model_validate(raw)
    except ValidationError as error:
        problems = "\n  ".join(_describe_error(raw, dict(item)) for item in error.errors())
        raise ConfigError(f"invalid configuration in {origin}:\n  {problems}") from None
