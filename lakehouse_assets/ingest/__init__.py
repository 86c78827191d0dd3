"""From landing files to staged batches: the landing zone, batching, the staging ledger, conversion."""
