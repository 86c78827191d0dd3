"""What proves a commit: the DuckDB checks, event-time completeness, lag and table health figures."""
