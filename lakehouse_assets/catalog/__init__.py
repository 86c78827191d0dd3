"""Iceberg catalogs and tables: one catalog mapping, metadata read without a JVM, table creation, types."""
