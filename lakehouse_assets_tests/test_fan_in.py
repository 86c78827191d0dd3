"""Which routed tables the fan-in committer has work for, read from the ledgers and route
directories alone (no Spark): one ledger record and one directory per table."""

from lakehouse_assets.batches.ledger import CommittedBatch, MintedBatch, StreamLedger
from lakehouse_assets.config.routed_streams import routed_stream_name
from lakehouse_assets.config.spec import StreamSpec
from lakehouse_assets.ingest.fan_in import tables_with_pending_routes
from lakehouse_assets.ingest.routing import route_file

ROUTER = StreamSpec.model_validate({"name": "tenants", "table_identifier": "t.${/tenant}", "auto_create": True})
TABLES = ["t.quiet", "t.new", "t.unbatched", "t.uncommitted", "t.done"]


def _route(paths, table: str, sequence: int) -> str:
    target = route_file(paths, ROUTER.name, table, sequence)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text('{"tenant": "x"}\n')
    return target.name


def _batch(paths, table: str, sequence: int, files: list[str], committed: bool) -> None:
    stream = routed_stream_name(ROUTER.name, table)
    ledger = StreamLedger(paths.staging(stream))
    ledger.mint(MintedBatch(stream, sequence, table, files, 16, 0.0, 0.0))
    if committed:
        ledger.record_committed(sequence, CommittedBatch(1, sequence, 0.0))


def test_a_table_is_pending_while_a_route_is_unbatched_or_its_latest_batch_uncommitted(paths):
    _route(paths, "t.new", 1)
    first = _route(paths, "t.unbatched", 1)
    _batch(paths, "t.unbatched", 1, [first], committed=True)
    _route(paths, "t.unbatched", 4)
    _batch(paths, "t.uncommitted", 1, [_route(paths, "t.uncommitted", 2)], committed=True)
    _batch(paths, "t.uncommitted", 2, [_route(paths, "t.uncommitted", 3)], committed=False)
    _batch(paths, "t.done", 1, [_route(paths, "t.done", 1), _route(paths, "t.done", 2)], committed=True)
    # A mint that died before writing its record leaves an empty directory: not a batch.
    paths.staging(routed_stream_name(ROUTER.name, "t.done")).joinpath("0000000002").mkdir()

    assert tables_with_pending_routes(paths, ROUTER, TABLES) == ["t.new", "t.unbatched", "t.uncommitted"]
