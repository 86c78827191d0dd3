"""Which checks must pass on a table's snapshot, and whether they did: read from the Dagster
instance by the assets, the sensors, publishing, ``lakehouse check`` and ``lakehouse status``."""

import dagster as dg

from lakehouse_assets.config.spec import ExpectationSpec, StreamSpec
from lakehouse_assets.defs import names


def blocking_expectations(streams: list[StreamSpec]) -> list[ExpectationSpec]:
    """The expectations a commit must meet (``on_failure: block``), once per name."""
    found: dict[str, ExpectationSpec] = {}
    for stream in streams:
        for expectation in stream.expectations:
            if expectation.on_failure == "block":
                found.setdefault(expectation.name, expectation)
    return list(found.values())


def blocking_check_names(streams: list[StreamSpec]) -> list[str]:
    """The checks that must pass on a snapshot before it is published."""
    change_checks = names.CHANGE_CHECK_NAMES if any(stream.applies_changes for stream in streams) else ()
    expectations = (names.EXPECTATIONS_CHECK,) if blocking_expectations(streams) else ()
    return [*names.CHECK_NAMES, *change_checks, *expectations]


EVALUATIONS_SEARCHED = 20
"""Check records read back to find the latest evaluation past runs that only planned the check."""


def latest_evaluation(instance: dg.DagsterInstance, check: dg.AssetCheckKey) -> dg.AssetCheckEvaluation | None:
    """The check's latest evaluation. A check that a run only planned so far (the run in progress,
    or one that died before the check ran) has a newer record without an evaluation; it is passed over."""
    for record in instance.event_log_storage.get_asset_check_execution_history(check, limit=EVALUATIONS_SEARCHED):
        if isinstance(record.evaluation, dg.AssetCheckEvaluation):
            return record.evaluation
    return None


def checks_not_passed(
    instance: dg.DagsterInstance, table_identifier: str, streams: list[StreamSpec], snapshot_id: int
) -> dict[str, str]:
    """The blocking checks whose latest evaluation did not pass on ``snapshot_id``, with what they
    found (or that they have not run on it)."""
    asset_key = names.table_key(table_identifier)
    problems = {}
    for name in blocking_check_names(streams):
        evaluation = latest_evaluation(instance, dg.AssetCheckKey(asset_key, name))
        checked = evaluation.metadata.get("snapshot_id") if evaluation else None
        if evaluation is None or checked is None or checked.value != str(snapshot_id):
            problems[name] = f"has not run on snapshot {snapshot_id}"
        elif not evaluation.passed:
            found = evaluation.metadata.get("found")
            problems[name] = f"failed: {found.value if found else evaluation.description}"
    return problems


def failed_checks(
    instance: dg.DagsterInstance, table_identifier: str, streams: list[StreamSpec], snapshot_id: int | None
) -> dict[str, str]:
    """The blocking checks that ran on ``snapshot_id`` and failed (none for no snapshot)."""
    if snapshot_id is None:
        return {}
    problems = checks_not_passed(instance, table_identifier, streams, snapshot_id)
    return {name: found for name, found in problems.items() if found.startswith("failed")}
