"""Columns built once per JVM and arguments (``jvm.column_cache``), and again whenever either changes."""

import pytest
from pyspark import SparkContext
from pyspark.sql import types as T

from lakehouse_assets.config.spec import StreamSpec
from lakehouse_assets.jvm.column_cache import cached_columns
from lakehouse_assets_tests.conftest import ORDERS_STREAM

STREAM = StreamSpec.model_validate(ORDERS_STREAM)
SCHEMA = T.StructType([T.StructField("id", T.LongType()), T.StructField("code", T.StringType())])


def test_columns_are_built_again_for_another_schema_stream_or_jvm_and_never_for_the_same(monkeypatch):
    built = []

    @cached_columns
    def build(schema: T.StructType, stream: StreamSpec, keys: list[str], from_lines: bool = True) -> list[object]:
        built.append((schema, stream.name, keys, from_lines))
        return [object()]

    first = build(SCHEMA, STREAM, ["id"])
    assert build(T.StructType.fromJson(SCHEMA.jsonValue()), STREAM.model_copy(), ["id"]) is first
    assert build(SCHEMA, STREAM, ["id"], from_lines=False) is not build(SCHEMA, STREAM, ["id"], from_lines=True)
    # A uuid column reads as a string column whose Iceberg type is in its metadata: another schema.
    uuid_code = T.StructType([SCHEMA["id"], T.StructField("code", T.StringType(), metadata={"iceberg_type": "uuid"})])
    changed = [
        (uuid_code, STREAM, ["id"]),
        (T.StructType([*SCHEMA.fields, T.StructField("added", T.DoubleType())]), STREAM, ["id"]),
        (SCHEMA, STREAM.model_copy(update={"version_column": "id"}), ["id"]),
        (SCHEMA, STREAM, []),
    ]
    for arguments in changed:
        assert build(*arguments) is not first
    assert len(built) == 3 + len(changed)

    monkeypatch.setattr(SparkContext, "_gateway", object())  # a process attached to another JVM
    assert build(SCHEMA, STREAM, ["id"]) is not first
    assert len(built) == 4 + len(changed)


def test_an_argument_that_cannot_tell_its_expressions_apart_is_refused_by_its_type():
    @cached_columns
    def build(value: object) -> list[object]:
        return [value]

    with pytest.raises(TypeError, match="no cache key for a object"):
        build(object())
