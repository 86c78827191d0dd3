"""From staged batches to Iceberg commits: recovery, fencing, summary keys, dead letters, audit branches."""
