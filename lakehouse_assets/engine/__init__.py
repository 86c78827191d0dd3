"""Spark: the session with catalog ``lake``, the shared Spark host, and the Java runtime it needs."""
