"""Commits made only onto the version read: which spellings of a metadata location name one file,
and which errors say another commit came first."""

import pytest
from py4j.protocol import Py4JJavaError

from lakehouse_assets.catalog.conditional_commits import same_location
from lakehouse_assets.engine.spark import lakehouse_session
from lakehouse_assets.jvm.spark_jvm import is_commit_conflict, jvm


@pytest.mark.parametrize(
    ("location", "other", "same"),
    [
        ("/w/t/metadata/v3.metadata.json", "file:/w/t/metadata/v3.metadata.json", True),
        ("file:///w/t/metadata/v3.metadata.json", "/w/t/metadata/v3.metadata.json", True),
        ("/w/t//metadata/v3.metadata.json", "file:/w/t/metadata/v3.metadata.json", True),
        ("/w/t/metadata/v3.metadata.json", "/w/t/metadata/v4.metadata.json", False),
        # A '#' or '?' in a directory name is part of the path, not a fragment or a query.
        ("/data#1/t/v3.metadata.json", "file:/data#1/t/v4.metadata.json", False),
        ("/data#1/t/v3.metadata.json", "file:///data#1/t/v3.metadata.json", True),
        ("/data?x/t/v3.metadata.json", "/data?x/t/v3.metadata.json", True),
        ("s3://bucket/t/v3.metadata.json", "s3://bucket/t/v3.metadata.json", True),
        ("s3://bucket/t/v3.metadata.json", "s3://bucket/t/v4.metadata.json", False),
    ],
)
def test_a_metadata_location_is_the_same_file_whatever_its_spelling(location, other, same):
    assert same_location(location, other) is same


@pytest.mark.spark
def test_a_commit_on_stale_metadata_is_a_conflict_by_its_java_class_and_other_errors_are_not(lake):
    spark = lakehouse_session(lake)
    spark.sql("CREATE TABLE lake.t.raced (id bigint) USING iceberg")
    java = jvm(spark)
    operations = java.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(
        spark._jsparkSession, "lake.t.raced"
    ).operations()
    read = operations.current()
    spark.sql("INSERT INTO lake.t.raced VALUES (1)")  # another committer moves the table on

    change = java.java.util.HashMap()
    change.put("lakehouse.test", "stale")
    with pytest.raises(Py4JJavaError) as stale:
        operations.commit(read, java.org.apache.iceberg.TableMetadata.buildFrom(read).setProperties(change).build())
    with pytest.raises(Exception) as missing:  # noqa: PT011 - any error that is not a conflict
        spark.sql("INSERT INTO lake.t.absent VALUES (1)")

    assert is_commit_conflict(stale.value)
    assert not is_commit_conflict(missing.value)
    assert not is_commit_conflict(ValueError("CommitFailedException in a message is not the exception"))
