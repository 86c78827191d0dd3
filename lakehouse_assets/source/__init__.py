"""The Iceberg CDC source and its search-index export."""
