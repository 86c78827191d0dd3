"""Domain exceptions, each with a message a data engineer can act on."""

import traceback


class LakehouseError(Exception):
    """Base class for every error this package raises on purpose."""


class ConfigError(LakehouseError):
    """The pipeline configuration is invalid; the message names the stream and the key."""


class IngestError(LakehouseError):
    """Events offered to the landing zone were refused; nothing was written."""


class BatchConflictError(LakehouseError):
    """A batch sequence was staged twice with different contents."""


class SequenceGapError(LakehouseError):
    """A batch is missing, so later batches of its stream cannot commit in order."""


class CommitOutcomeUnknownError(LakehouseError):
    """The catalog failed after a commit may have landed; the ancestry decides on the next run."""


class CommitConflictError(LakehouseError):
    """A commit refused because the table changed since its base; retried after re-reading."""


class TableNotFoundError(LakehouseError):
    """A static target table does not exist and the stream may not create it."""


class FencedError(LakehouseError):
    """Another committer moved the table since this one planned; this one stops without committing."""


class TruncatedAncestryError(LakehouseError):
    """Snapshots expired without a lakehouse checkpoint, so what was committed before them is unknown."""


class TableMovedError(LakehouseError):
    """The table changed between reading it and writing what was decided from it; nothing was committed."""


class DiscardRefusedError(LakehouseError):
    """The audited commits may not be discarded: a publish of them committed their dead letters."""


class SourceCheckpointError(LakehouseError):
    """The last source snapshot synced expired or left the ancestry; only a new initial load recovers."""


class BranchesDivergedError(LakehouseError):
    """Main and the audit branch of a table no longer contain one another."""


class PublishRefusedError(LakehouseError):
    """The audited snapshot may not be published: a check did not pass on it, or it moved."""


def describe_error(error: BaseException) -> str:
    """What to report of an error caught so that other tables go on: the message of a
    LakehouseError (written for the user), else the exception's type, message and traceback."""
    if isinstance(error, LakehouseError):
        return str(error)
    return "".join(traceback.format_exception(error)).rstrip()
