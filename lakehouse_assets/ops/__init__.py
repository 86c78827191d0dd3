"""Operating the lakehouse: table maintenance, status and dead-letter replay."""
