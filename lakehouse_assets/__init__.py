"""Stream events and change-data-capture into Apache Iceberg tables with Spark, exactly once."""
