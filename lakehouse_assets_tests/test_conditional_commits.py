"""Which spellings of a metadata location name one file, for commits made only onto the version read."""

import pytest

from lakehouse_assets.catalog.conditional_commits import same_location


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
