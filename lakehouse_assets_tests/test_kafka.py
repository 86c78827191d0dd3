"""Kafka streams end to end on a real broker: offset ranges in, offsets in the table, every record once.

Each test has a topic of its own on the session's broker, produces its records with librdkafka
(transactions included), runs the pipeline with the real engines and reads the table back with
DuckDB against the records it produced (the oracle).
"""

from __future__ import annotations

import json
import shutil
import signal
import time
import uuid
from pathlib import Path

import dagster as dg
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic
from pyspark import SparkContext

from lakehouse_assets import faults
from lakehouse_assets.cli.status import lakehouse_status
from lakehouse_assets.commit import summary_keys
from lakehouse_assets.definitions import build_definitions
from lakehouse_assets.defs import names
from lakehouse_assets.engine.spark import lakehouse_session
from lakehouse_assets.ingest.kafka_batching import kafka_progress
from lakehouse_assets.ingest.micro_batching import mint_next_batch
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.ops.kafka_broker import LocalBroker, LocalKafkaCluster, local_kafka_cluster
from lakehouse_assets.quality.duck import iceberg_connection, scan
from lakehouse_assets.runner import run_until_idle
from lakehouse_assets_tests.conftest import fail_python_workers, write_config
from lakehouse_assets_tests.fault_injection.pipeline import PausedProcess, run_pipeline, start_paused_at
from lakehouse_assets_tests.fault_injection.pipeline import run_lakehouse as run_pipeline_command

pytestmark = pytest.mark.spark

BROKER_DOWN_SECONDS = 8
# A read slow enough to be caught in its middle: each record produced as a batch of its own, and
# Spark's consumer fetching one batch per request (at least one always comes, whatever the limit).
ONE_RECORD_PER_BATCH = {"linger.ms": 0, "batch.num.messages": 1}
ONE_BATCH_PER_FETCH = {"max.partition.fetch.bytes": "1"}
Brokers = LocalBroker | LocalKafkaCluster

TICKS_COLUMNS = [
    {"name": "id", "type": "long", "required": True},
    {"name": "price", "type": "double"},
    {"name": "kafka_partition", "type": "int"},
    {"name": "kafka_offset", "type": "long"},
    {"name": "kafka_key", "type": "string"},
    {"name": "kafka_headers", "type": "map<string, string>"},
]
METADATA = {"kafka_partition": "partition", "kafka_offset": "offset", "kafka_key": "key", "kafka_headers": "headers"}


# A topic the broker compacts as soon as it can: a segment rolls on the first record 100 ms after
# the segment's first, and the log cleaner compacts every closed segment.
COMPACTED = {
    "cleanup.policy": "compact",
    "segment.ms": "100",
    "min.cleanable.dirty.ratio": "0.001",
    "min.compaction.lag.ms": "0",
}


def _topic(
    broker: Brokers, partitions: int, settings: dict[str, str] | None = None, assignment: list[list[int]] | None = None
) -> str:
    """A new topic, on one replica, or with ``assignment``: each partition's replicas by node id,
    its preferred leader first."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    if assignment is None:
        topic = NewTopic(name, partitions, 1, config=settings or {})
    else:
        topic = NewTopic(name, partitions, replica_assignment=assignment, config=settings or {})
    admin.create_topics([topic])[name].result()
    return name


def _producer(broker: Brokers, transactional: str | None = None, **settings: object) -> Producer:
    chosen = {"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 5, **settings}
    if transactional:
        chosen["transactional.id"] = transactional
    return Producer(chosen)


def _produce(
    producer: Producer, topic: str, records: list[tuple[int, bytes | None]], keys: list[bytes] | None = None
) -> None:
    """Produce ``records`` (partition, value), keyed by ``keys`` (else ``k<partition>``), and wait
    until the broker acknowledged every one."""
    failures: list[str] = []

    def delivered(error, _message) -> None:
        if error is not None:
            failures.append(str(error))

    for index, (partition, value) in enumerate(records):
        producer.produce(
            topic,
            value,
            key=keys[index] if keys else f"k{partition}".encode(),
            partition=partition,
            headers=[("origin", b"test")],
            on_delivery=delivered,
        )
    assert producer.flush(30) == 0
    assert failures == []


def _wait_for_partitions(broker: LocalBroker, topic: str, count: int) -> None:
    """Until the broker's metadata shows the topic's ``count`` partitions (it follows the controller)."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    deadline = time.monotonic() + 30
    while len(admin.list_topics(topic, timeout=10).topics[topic].partitions) < count:
        assert time.monotonic() < deadline, f"topic {topic} never showed {count} partitions"
        time.sleep(0.1)


def _tick(tick_id: int) -> bytes:
    return json.dumps({"id": tick_id, "price": tick_id / 4}).encode()


def _kafka_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, broker: Brokers, stream: dict) -> Lakehouse:
    write_config(tmp_path, {"catalog": {"type": "hadoop"}, "streams": [stream]}, monkeypatch)
    return Lakehouse.from_env()


def _ticks_stream(broker: Brokers, topic: str, **source: object) -> dict:
    return {
        "name": "ticks",
        "source": {"kafka": {"bootstrap_servers": broker.bootstrap_servers, "topic": topic, **source}},
        "table_identifier": "market.ticks",
        "auto_create": True,
        "schema": {"columns": TICKS_COLUMNS},
        "flush": {"max_age": "1s"},
        "commit_interval": "0s",
    }


def _rows(lake: Lakehouse, identifier: str, columns: str) -> list[tuple]:
    table = lake.require_table(identifier)
    location = lake.metadata_location(identifier)
    query = f"SELECT {columns} FROM {scan(location, table.current_snapshot().snapshot_id)} ORDER BY ALL"
    return iceberg_connection().sql(query).fetchall()


def _committed_offsets(lake: Lakehouse, identifier: str) -> dict[str, int]:
    summary = lake.require_table(identifier).current_snapshot().summary.additional_properties
    return json.loads(summary[summary_keys.KAFKA_OFFSETS])


def _oracle_consumer(broker: Brokers) -> Consumer:
    settings = {
        "bootstrap.servers": broker.bootstrap_servers,
        "group.id": "oracle",
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
    }
    return Consumer(settings)


def _end_offsets(broker: Brokers, topic: str, partitions: int) -> dict[str, int]:
    consumer = _oracle_consumer(broker)
    try:
        return {
            f"{topic}/{p}": consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(partitions)
        }
    finally:
        consumer.close()


def _topic_ids(broker: LocalBroker, topic: str, partitions: int) -> list[int]:
    """The ``id`` of every record the topic holds now, read from its first offset to its end."""
    ends = _end_offsets(broker, topic, partitions)
    consumer = _oracle_consumer(broker)
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    reached = {name: 0 for name in ends}
    ids = []
    deadline = time.monotonic() + 60
    try:
        while any(reached[name] < ends[name] - 1 for name in ends):
            assert time.monotonic() < deadline, f"could not read {topic} to its end offsets {ends}"
            message = consumer.poll(1)
            if message is None or message.error() is not None:
                continue
            reached[f"{topic}/{message.partition()}"] = message.offset()
            ids.append(json.loads(message.value())["id"])
    finally:
        consumer.close()
    return sorted(ids)


def test_a_topic_lands_once_with_its_offsets_in_the_table_and_new_partitions_join(
    tmp_path, monkeypatch, kafka_broker, instance
):
    topic = _topic(kafka_broker, 4)
    lake = _kafka_config(
        tmp_path, monkeypatch, kafka_broker, _ticks_stream(kafka_broker, topic, metadata_columns=METADATA)
    )
    plain = _producer(kafka_broker)
    _produce(plain, topic, [(i % 4, _tick(i)) for i in range(400)])
    # Hostile values: not JSON, no value at all, invalid UTF-8, an empty object, a large record.
    _produce(plain, topic, [(0, b"not json"), (1, None), (2, b"\xff\xfe{"), (3, b"{}")])
    _produce(plain, topic, [(0, json.dumps({"id": 10_000, "price": 1.0, "note": "x" * 900_000}).encode())])
    # A transaction committed, one aborted: only the committed one's records land.
    transactional = _producer(kafka_broker, f"tx-{topic}")
    transactional.init_transactions(30)
    for commit, ids in ((True, range(400, 440)), (False, range(440, 480)), (True, range(480, 500))):
        transactional.begin_transaction()
        _produce(transactional, topic, [(i % 4, _tick(i)) for i in ids])
        (transactional.commit_transaction if commit else transactional.abort_transaction)(30)

    report = run_until_idle(build_definitions(lake.config), instance, log=lambda _: None)

    assert report.failed == []
    expected = [*range(400), *range(400, 440), *range(480, 500), 10_000]
    assert [row[0] for row in _rows(lake, "market.ticks", "id")] == sorted(expected)
    kept = _rows(lake, "market.ticks", "id, kafka_partition, kafka_key, kafka_headers['origin']")
    assert all(partition == tick_id % 4 and key == f"k{partition}" for tick_id, partition, key, _ in kept[:400])
    assert {origin for *_, origin in kept} == {"test"}
    dead = _rows(lake, "market.ticks_dead_letters", "source_file, reason")
    assert dead == [
        (f"{topic}/0", "not a JSON object"),
        (f"{topic}/1", "not a JSON object"),
        (f"{topic}/2", "not a JSON object"),
        (f"{topic}/3", "missing required field 'id'"),
    ]
    assert _committed_offsets(lake, "market.ticks") == _end_offsets(kafka_broker, topic, 4)
    for check_name in names.CHECK_NAMES:
        key = dg.AssetCheckKey(names.table_key("market.ticks"), check_name)
        assert instance.get_latest_asset_check_evaluation_record(key).status.value == "SUCCEEDED", check_name

    # Two partitions added while the stream runs: read from their first offset.
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap_servers})
    admin.create_partitions([NewPartitions(topic, 6)])[topic].result()
    _wait_for_partitions(kafka_broker, topic, 6)
    _produce(_producer(kafka_broker), topic, [(i % 6, _tick(i)) for i in range(1000, 1060)])
    report = run_until_idle(build_definitions(lake.config), instance, log=lambda _: None)

    assert report.failed == []
    assert [row[0] for row in _rows(lake, "market.ticks", "id")] == sorted([*expected, *range(1000, 1060)])
    assert _committed_offsets(lake, "market.ticks") == _end_offsets(kafka_broker, topic, 6)
    [status] = lakehouse_status(lake, instance)
    assert status["streams"][0]["kafka_lag"] == 0
    assert len(status["streams"][0]["kafka_partitions"]) == 6
    # The staging asset shows the lag when the batch was staged: the batch's own records.
    staging = instance.get_latest_materialization_event(names.staged_batches_key("ticks")).asset_materialization
    assert staging.metadata["kafka_lag"].value == "60"
    assert staging.metadata["kafka_records"].value == 60


def test_a_crash_after_the_commit_and_a_wiped_ledger_resume_from_the_table_offsets(
    tmp_path, monkeypatch, kafka_broker, instance
):
    topic = _topic(kafka_broker, 3)
    lake = _kafka_config(tmp_path, monkeypatch, kafka_broker, _ticks_stream(kafka_broker, topic, max_records=100))
    producer = _producer(kafka_broker)
    _produce(producer, topic, [(i % 3, _tick(i)) for i in range(250)])
    # A real process of its own, on this worker's warm JVM (``fault_injection/forked_processes.py``).
    killed = run_pipeline({faults.CRASH_ENV: faults.COMMITTER_AFTER_COMMIT})
    assert killed.returncode == -signal.SIGKILL, killed.stdout[-3000:] + killed.stderr[-3000:]
    committed_before = _rows(lake, "market.ticks", "count(*)")[0][0]
    assert 0 < committed_before <= 100  # the first batch (max_records), committed before the kill
    # The operator removes the staging ledger; the broker restarts, killed, before the next run.
    shutil.rmtree(lake.paths.staging("ticks"))
    kafka_broker.restart(kill=True)
    _produce(producer, topic, [(i % 3, _tick(i)) for i in range(250, 300)])

    report = run_until_idle(build_definitions(lake.config), instance, log=lambda _: None)

    assert report.failed == []
    assert [row[0] for row in _rows(lake, "market.ticks", "id")] == list(range(300))
    assert _committed_offsets(lake, "market.ticks") == _end_offsets(kafka_broker, topic, 3)
    assert kafka_progress(lake, lake.stream("ticks")).lag == 0


def test_records_deleted_before_they_were_read_fail_the_batch_naming_the_range_until_skipped(
    tmp_path, monkeypatch, kafka_broker, instance
):
    topic = _topic(kafka_broker, 2)
    stream = _ticks_stream(kafka_broker, topic)
    lake = _kafka_config(tmp_path, monkeypatch, kafka_broker, stream)
    producer = _producer(kafka_broker)
    _produce(producer, topic, [(i % 2, _tick(i)) for i in range(20)])
    assert run_until_idle(build_definitions(lake.config), instance, log=lambda _: None).failed == []
    _produce(producer, topic, [(0, _tick(i)) for i in range(20, 40)])
    batch, _ = mint_next_batch(lake, lake.stream("ticks"), drain=True)
    assert batch is not None and batch.offsets[f"{topic}/0"] == [10, 30]
    # Retention (here: records deleted by hand) removes offsets 10-24 before the batch is read.
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap_servers})
    admin.delete_records([TopicPartition(topic, 0, 25)])[TopicPartition(topic, 0, 25)].result()

    report = run_until_idle(build_definitions(lake.config), instance, log=lambda _: None)

    assert report.failed
    failure = _run_errors(instance)
    assert f"partition {topic}/0 offsets 10-24 were deleted from Kafka" in failure
    assert _rows(lake, "market.ticks", "count(*)")[0][0] == 20

    stream["source"]["kafka"]["on_records_lost"] = "skip"
    lake = _kafka_config(tmp_path, monkeypatch, kafka_broker, stream)
    with dg.DagsterInstance.get() as fresh:
        assert run_until_idle(build_definitions(lake.config), fresh, log=lambda _: None).failed == []
    assert [row[0] for row in _rows(lake, "market.ticks", "id")] == [*range(20), *range(35, 40)]
    summary = lake.require_table("market.ticks").current_snapshot().summary.additional_properties
    assert json.loads(summary[summary_keys.KAFKA_LOST_OFFSETS]) == {f"{topic}/0": [[10, 25]]}


def _run_errors(instance: dg.DagsterInstance) -> str:
    """Every failed step's error message of the instance's runs, joined."""
    messages = []
    for run in instance.get_runs():
        for record in instance.get_records_for_run(run.run_id).records:
            event = record.event_log_entry.dagster_event
            if event is not None and event.event_type == dg.DagsterEventType.STEP_FAILURE:
                messages.append(event.step_failure_data.error.to_string())
    return "\n".join(messages)


def test_debezium_changes_from_kafka_apply_in_source_order(tmp_path, monkeypatch, kafka_broker, instance):
    topic = _topic(kafka_broker, 2)
    stream = {
        "name": "customers",
        "source": {
            "kafka": {"bootstrap_servers": kafka_broker.bootstrap_servers, "topic": topic, "format": "debezium"}
        },
        "table_identifier": "crm.customers",
        "auto_create": True,
        "identifier_columns": ["id"],
        "schema": {"columns": [{"name": "id", "type": "long", "required": True}, {"name": "name", "type": "string"}]},
        "flush": {"max_age": "1s"},
        "commit_interval": "0s",
    }
    lake = _kafka_config(tmp_path, monkeypatch, kafka_broker, stream)

    def change(op: str, key: int, lsn: int, name: str | None = None) -> tuple[int, bytes]:
        row = {"id": key, "name": name}
        envelope = {
            "op": op,
            "before": row if op == "d" else None,
            "after": None if op == "d" else row,
            "source": {"lsn": lsn},
        }
        return key % 2, json.dumps(envelope).encode()

    producer = _producer(kafka_broker)
    # A snapshot read of every key, then updates and a delete with its tombstone.
    _produce(producer, topic, [change("r", key, 10 + key, f"v0-{key}") for key in range(6)])
    _produce(
        producer, topic, [change("u", 1, 100, "v1-1"), change("d", 2, 101), (0, None), change("c", 7, 102, "v0-7")]
    )
    assert run_until_idle(build_definitions(lake.config), instance, log=lambda _: None).failed == []
    # A late change (an older position than the committed one) never overwrites the newer row.
    _produce(producer, topic, [change("u", 1, 50, "stale"), change("u", 3, 200, "v1-3")])
    assert run_until_idle(build_definitions(lake.config), instance, log=lambda _: None).failed == []

    assert _rows(lake, "crm.customers", "id, name") == [
        (0, "v0-0"),
        (1, "v1-1"),
        (3, "v1-3"),
        (4, "v0-4"),
        (5, "v0-5"),
        (7, "v0-7"),
    ]
    assert lake.table("crm.customers_dead_letters") is None or not _rows(lake, "crm.customers_dead_letters", "*")


def test_dead_letters_of_a_kafka_stream_replay_once_after_a_fix(tmp_path, monkeypatch, kafka_broker, instance):
    topic = _topic(kafka_broker, 2)
    stream = _ticks_stream(kafka_broker, topic)
    stream["expectations"] = [{"name": "price_positive", "condition": "price > 0", "on_failure": "dead_letter"}]
    lake = _kafka_config(tmp_path, monkeypatch, kafka_broker, stream)
    _produce(_producer(kafka_broker), topic, [(0, _tick(4)), (1, json.dumps({"id": 1, "price": -2.5}).encode())])
    assert run_until_idle(build_definitions(lake.config), instance, log=lambda _: None).failed == []
    assert _rows(lake, "market.ticks_dead_letters", "reason") == [("expectation price_positive not met: price > 0",)]

    stream["expectations"][0]["condition"] = "price > -10"
    lake = _kafka_config(tmp_path, monkeypatch, kafka_broker, stream)
    replayed = run_pipeline_command(["dlq", "replay", "--table", "market.ticks"])
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    # A batch of replays only: no record to read from Kafka, the replayed keys to delete.
    fail_python_workers(lakehouse_session(lake), monkeypatch, tmp_path / "no-python")
    with dg.DagsterInstance.get() as fresh:
        assert run_until_idle(build_definitions(lake.config), fresh, log=lambda _: None).failed == []

    assert _rows(lake, "market.ticks", "id, price") == [(1, -2.5), (4, 1.0)]
    assert _rows(lake, "market.ticks_dead_letters", "count(*)") == [(0,)]
    assert _committed_offsets(lake, "market.ticks") == _end_offsets(kafka_broker, topic, 2)


def test_a_compacted_topic_lands_what_compaction_kept_and_its_gaps_stall_nothing(
    tmp_path, monkeypatch, kafka_broker, instance
):
    topic = _topic(kafka_broker, 2, COMPACTED)
    lake = _kafka_config(tmp_path, monkeypatch, kafka_broker, _ticks_stream(kafka_broker, topic))
    producer = _producer(kafka_broker)
    # Ten keys per partition, each written 20 times; then, after the segment's age, one record per
    # partition that rolls it, so the cleaner compacts the closed segment to each key's last value.
    updates = [(i % 2, _tick(i)) for i in range(400)]
    _produce(producer, topic, updates, [f"key-{i % 20}".encode() for i in range(400)])
    time.sleep(0.5)
    _produce(producer, topic, [(0, _tick(1000)), (1, _tick(1001))], [b"roll-0", b"roll-1"])
    kept = sorted([*range(380, 400), 1000, 1001])  # each key's last value, and the rolls
    deadline = time.monotonic() + 60
    while (found := _topic_ids(kafka_broker, topic, 2)) != kept:
        assert time.monotonic() < deadline, f"the broker never compacted {topic}: {len(found)} records"
        time.sleep(0.5)

    report = run_until_idle(build_definitions(lake.config), instance, log=lambda _: None)

    # The offsets compaction removed are gaps, not lost records: no failure, no dead letter.
    assert report.failed == []
    assert [row[0] for row in _rows(lake, "market.ticks", "id")] == kept
    assert lake.table("market.ticks_dead_letters") is None
    assert _committed_offsets(lake, "market.ticks") == _end_offsets(kafka_broker, topic, 2)
    assert kafka_progress(lake, lake.stream("ticks")).lag == 0


def _held_read(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    brokers: Brokers,
    partitions: int,
    records: int,
    assignment: list[list[int]] | None = None,
) -> tuple[Lakehouse, str, PausedProcess]:
    """A topic of ``partitions`` (on one replica, or as ``assignment`` places them on a
    cluster's brokers), ``records`` ticks in it (ids ``0`` up), each in a batch of its own so the stream
    (``ONE_BATCH_PER_FETCH``) reads them one request at a time, and a real pipeline process let go
    from just before Spark reads them: its lake, the topic and the process."""
    topic = _topic(brokers, partitions, assignment=assignment)
    stream = _ticks_stream(brokers, topic, properties=ONE_BATCH_PER_FETCH)
    lake = _kafka_config(tmp_path, monkeypatch, brokers, stream)
    ticks = [(i % partitions, _tick(i)) for i in range(records)]
    _produce(_producer(brokers, **ONE_RECORD_PER_BATCH), topic, ticks)
    paused = start_paused_at(faults.KAFKA_BEFORE_READ, tmp_path)
    paused.release()
    _wait_until_the_read_is_under_way(partitions)
    return lake, topic, paused


def _wait_until_the_read_is_under_way(partitions: int) -> None:
    """Until a Spark stage that reads a Kafka batch of ``partitions`` partitions (one task each) has
    finished some of its tasks and not all: the middle of the read. The held pipeline process runs
    on this worker's JVM (``fault_injection/forked_processes.py``), so this process's Spark context
    sees its stages."""
    tracker = SparkContext.getOrCreate().statusTracker()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        for stage_id in tracker.getActiveStageIds():
            stage = tracker.getStageInfo(stage_id)
            if stage is not None and stage.numTasks == partitions and 0 < stage.numCompletedTasks < partitions:
                return
        time.sleep(0.01)
    raise AssertionError(f"no stage read the {partitions} partitions' batch part way within 300 s")


def test_the_broker_killed_in_the_middle_of_a_read_loses_and_duplicates_nothing(
    tmp_path, monkeypatch, kafka_broker, instance
):
    # The broker dies (SIGKILL) with some partitions read and others not, and comes back
    # BROKER_DOWN_SECONDS later; Spark's consumers wait for it.
    lake, topic, paused = _held_read(tmp_path, monkeypatch, kafka_broker, 8, 2400)
    kafka_broker.stop(kill=True)
    time.sleep(BROKER_DOWN_SECONDS)
    kafka_broker.start()
    rode_through = paused.process.wait(timeout=600)

    # Whether that run rode the outage through or failed, the next run leaves every record once.
    drained = run_pipeline_command(["run", "--until-idle"])
    assert drained.returncode == 0, drained.stdout[-3000:] + drained.stderr[-3000:] + paused.log.read_text()[-3000:]
    assert [row[0] for row in _rows(lake, "market.ticks", "id")] == list(range(2400))
    assert _committed_offsets(lake, "market.ticks") == _end_offsets(kafka_broker, topic, 8)
    assert rode_through == 0, paused.log.read_text()[-3000:]


def _leader_of(cluster: LocalKafkaCluster, topic: str, partition: int) -> int:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    return admin.list_topics(topic, timeout=10).topics[topic].partitions[partition].leader


# The local cluster's two nodes: node 1 is the controller and a broker, never killed; node 2 is a
# broker only, the preferred leader of partition 0 and of every other even partition (the odd ones'
# is node 1), each partition replicated to both. Killing node 2 is killing partition 0's leader
# and no controller: the controller elects node 1, in sync, and the read goes on there.
LEADER_NODE = 2


def test_a_partition_leader_killed_in_the_middle_of_a_read_fails_over_to_a_replica(tmp_path, monkeypatch, instance):
    partitions = 6
    assignment = [[LEADER_NODE, 1] if p % 2 == 0 else [1, LEADER_NODE] for p in range(partitions)]
    with local_kafka_cluster(tmp_path / "kafka") as cluster:
        # Partition 0's leader dies (SIGKILL) in the middle of the read and stays down: the
        # controller elects a replica in sync, and the read goes on there.
        lake, topic, paused = _held_read(tmp_path, monkeypatch, cluster, partitions, 1800, assignment)
        dead = _leader_of(cluster, topic, 0)
        assert dead == LEADER_NODE, f"partition 0 is led by node {dead}, not the broker-only node"
        cluster.broker(dead).stop(kill=True)
        assert paused.process.wait(timeout=600) == 0, paused.log.read_text()[-3000:]

        # Records produced while it is down (the replica in sync, leading now, takes them) land too.
        more = [(i % partitions, _tick(i)) for i in range(1800, 1900)]
        _produce(_producer(cluster, **{"enable.idempotence": True}), topic, more)
        drained = run_pipeline_command(["run", "--until-idle"])
        assert drained.returncode == 0, drained.stdout[-3000:] + drained.stderr[-3000:]
        assert [row[0] for row in _rows(lake, "market.ticks", "id")] == list(range(1900))
        assert _committed_offsets(lake, "market.ticks") == _end_offsets(cluster, topic, partitions)
        assert _leader_of(cluster, topic, 0) != dead


def test_a_kafka_value_beyond_its_column_type_promotes_the_column_with_schema_evolution(
    tmp_path, monkeypatch, kafka_broker, instance
):
    topic = _topic(kafka_broker, 2)
    stream = _ticks_stream(kafka_broker, topic)
    stream["schema_evolution"] = True
    columns = [{"name": "id", "type": "long", "required": True}, {"name": "price", "type": "float"}]
    stream["schema"] = {"columns": columns}
    lake = _kafka_config(tmp_path, monkeypatch, kafka_broker, stream)
    producer = _producer(kafka_broker)
    _produce(producer, topic, [(0, _tick(1))])
    assert run_until_idle(build_definitions(lake.config), instance, log=lambda _: None).failed == []
    _produce(producer, topic, [(1, json.dumps({"id": 2, "price": 1e300}).encode())])

    assert run_until_idle(build_definitions(lake.config), instance, log=lambda _: None).failed == []

    assert str(lake.require_table("market.ticks").schema().find_field("price").field_type) == "double"
    assert _rows(lake, "market.ticks", "id, price") == [(1, 0.25), (2, 1e300)]


def test_a_cluster_id_that_starts_with_a_dash_formats_the_broker_log(tmp_path):
    """A cluster id is URL-safe base64, one in 64 starts with "-": the broker's log is formatted
    for it all the same (the tool once took it for an option and the broker never started)."""
    broker = LocalBroker.at(tmp_path / "broker")
    broker.cluster_id = "-IoYBA8-Rj2bJL_EBvJeZA"

    broker.format()

    assert "cluster.id=-IoYBA8-Rj2bJL_EBvJeZA" in (tmp_path / "broker" / "log" / "meta.properties").read_text()
