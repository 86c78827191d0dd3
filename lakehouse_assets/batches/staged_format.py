"""The format a writer stages a batch in, and change operations: names only, no Spark.

The writer stages each event as a row with these system columns beside the table's columns; the
committer, the dead-letter writer, the checks and the tools read them back. Change events carry
one of these operations (the sink RFC's names, case-insensitive), collapsed per key to UPSERT or
DELETE before a MERGE.
"""

EVENT_COLUMN = "_lakehouse_event"
"""The event's original line."""
SOURCE_FILE_COLUMN = "_lakehouse_source_file"
LINE_COLUMN = "_lakehouse_line"
REASON_COLUMN = "_lakehouse_reason"
"""Why the event was rejected; null for a converted event."""
OPERATION_COLUMN = "_lakehouse_operation"
UNCOERCIBLE_COLUMN = "_lakehouse_uncoercible"
"""The optional columns whose value in the event could not be coerced to their type (so NULL)."""
POSITION_COLUMN = "_lakehouse_position"

INSERT, UPDATE, DELETE = "INSERT", "UPDATE", "DELETE"
UPSERT = "UPSERT"
OPERATION_BY_NAME = {
    **dict.fromkeys(("index", "insert", "create", "c", "i", "r"), INSERT),
    **dict.fromkeys(("update", "u"), UPDATE),
    **dict.fromkeys(("delete", "d"), DELETE),
}
