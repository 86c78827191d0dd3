"""Batches: the files events land in, the ledger of the batches cut from them and the format a batch
is staged in. The contract between ``ingest``, which writes them, and ``commit``, which publishes
them; ``commit`` imports nothing from ``ingest``."""
