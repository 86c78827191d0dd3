"""Read landing files as lines for Spark: each line's text, file name and line number.

Landing file names are data (any byte but ``/``): Spark reads them through links named by position,
so no character of a name means anything to Hadoop. Lines keep their bytes as landed;
:func:`valid_text` makes one valid UTF-8 for writing it.
"""

from __future__ import annotations

import os
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from lakehouse_assets.batches.staged_format import EVENT_COLUMN, LINE_COLUMN, SOURCE_FILE_COLUMN
from lakehouse_assets.errors import LakehouseError
from lakehouse_assets.jvm.spark_jvm import copied_session

_SPLIT = "_lakehouse_split"
_ROW_ID = "_lakehouse_row_id"
_SPLIT_LINES = "_lakehouse_split_lines"
_SPLIT_FIRST_ROW = "_lakehouse_split_first_row"
_LINES_BEFORE = "_lakehouse_lines_before"
_POSITION = "_lakehouse_file_position"
_LINE = "_lakehouse_line"
# ``monotonically_increasing_id`` is the partition's index above its low 33 bits, the row's place below.
PARTITION_ROWS_MASK = (1 << 33) - 1
# Whole files as partitions (no counting pass) for up to this many files per core; and below one
# file per core, for batches this small, where an idle core costs less than the counting pass.
WHOLE_FILES_PER_CORE = 4
SMALL_BATCH_BYTES = 16 * 1024 * 1024
BATCH_COLUMN = "_lakehouse_batch"
"""Which batch a line belongs to when the batches of many streams are read at once."""
BYTE_ORDER_MARK = "\ufeff"
# Characters Hadoop reads as a glob pattern in a path (the home's, say); escaped, they are literal.
GLOB_CHARACTERS = "\\{}[]*?"
LINK_DIGITS = 6
LINK_SUFFIX = ".ndjson"


def literal_path(path: str) -> str:
    """``path`` with Hadoop's glob characters escaped, so Spark reads exactly that file."""
    return "".join(f"\\{character}" if character in GLOB_CHARACTERS else character for character in path)


def link_files(files: list[str], links: Path) -> list[str]:
    """Symbolic links in ``links`` to ``files``, named by their position: Spark reads the links, so
    no character of a landing file's name (a glob, a ``:``, a line break) means anything to Hadoop."""
    links.mkdir(parents=True, exist_ok=True)
    linked = []
    for index, file in enumerate(files):
        link = links / f"{index:06d}{LINK_SUFFIX}"
        try:
            link.symlink_to(file)
        except FileExistsError:  # a repeated or concurrent attempt of the batch made it already
            if os.readlink(link) != file:
                raise LakehouseError(f"{link} points to {os.readlink(link)}, not to {file}") from None
        linked.append(literal_path(str(link)))
    return linked


def _whole_file_reader(spark: SparkSession, sizes: list[int]) -> SparkSession | None:
    """A session that reads each file of ``sizes`` bytes as one partition of its own, or None when
    that would cost parallelism: a file larger than one split, fewer files than cores for a batch
    worth splitting, or so many small files that packing them into few partitions pays."""
    split_bytes = spark._jsparkSession.sessionState().conf().filesMaxPartitionBytes()
    cores = spark.sparkContext.defaultParallelism
    present = [size for size in sizes if size]
    if not present or max(present) > split_bytes or len(present) > WHOLE_FILES_PER_CORE * cores:
        return None
    if len(present) < cores and sum(present) > SMALL_BATCH_BYTES:
        return None
    # A copy of the session with a file's cost to open as large as a split: Spark cuts no file and
    # packs no two files into one partition (FilePartition.getFilePartitions), unless told to cap
    # the number of partitions. Landing files are never modified, so a file's size is the size
    # Spark plans with.
    reader = copied_session(spark)
    reader.conf.set("spark.sql.files.maxPartitionBytes", str(split_bytes))
    reader.conf.set("spark.sql.files.openCostInBytes", str(split_bytes))
    reader.conf.unset("spark.sql.files.maxPartitionNum")
    return reader


def valid_text(text: Column) -> Column:
    """``text`` (a line as landed) as valid UTF-8, for writing it: Spark keeps a line's bytes as
    they are, and Parquet readers refuse invalid strings. Through a Java string, invalid UTF-8
    becomes U+FFFD, as it does in every JSON parse of the line (so a converted value is valid)."""
    return F.decode(F.encode(text, "UTF-8"), "UTF-8")


def read_landing_lines(
    spark: SparkSession, files: list[str], links: Path, batch_of_file: list[int] | None = None
) -> DataFrame:
    """One row per line of the files that is not blank (spaces, tabs, a carriage return): its text
    (without a byte order mark; its bytes as landed, so :func:`valid_text` before it is written),
    file name and 1-based line number. Names are data: Spark reads the
    files through links in ``links`` named by position, and each line keeps its file's own name.

    Spark's text reader streams each split of a file in order but gives no line numbers. A
    line's place in its partition comes from ``monotonically_increasing_id``, which counts a
    partition's rows in reading order (taken before any filter: Spark pushes no filter below it).
    When each file is read whole as a partition of its own (``_whole_file_reader``; empty files
    are not read), that place is the line number. Otherwise lines are numbered per split: a
    first, cheap pass counts the lines of every split (a few rows, broadcast), and a line's number
    is the lines of its file's earlier splits plus its place in its own split; both passes plan
    the same splits, so the place is the same in both.

    With ``batch_of_file`` (one number per file), the batches of many streams are read at once
    (files of different directories may share a name): each row also carries its file's batch
    number in ``BATCH_COLUMN``.
    """
    names = F.array(*[F.lit(Path(file).name) for file in files])
    position = F.substring(F.col("_metadata.file_name"), 1, LINK_DIGITS).cast("int") + 1
    text = F.col("value")

    def scan(session: SparkSession, paths: list[str]) -> DataFrame:
        return (
            session.read.option("lineSep", "\n")
            .text(paths)
            .select(
                F.when(text.startswith(BYTE_ORDER_MARK), text.substr(F.lit(2), F.length(text)))
                .otherwise(text)
                .alias(EVENT_COLUMN),
                F.element_at(names, position).alias(SOURCE_FILE_COLUMN),
                position.alias(_POSITION),
                F.col("_metadata.file_block_start").alias(_SPLIT),
                F.monotonically_increasing_id().alias(_ROW_ID),
            )
        )

    linked = link_files(files, links)
    sizes = [os.path.getsize(file) for file in files]
    reader = _whole_file_reader(spark, sizes)
    if reader is not None:
        raw = scan(reader, [link for link, size in zip(linked, sizes, strict=True) if size])
        numbered = raw.withColumn(_LINE, F.col(_ROW_ID).bitwiseAND(PARTITION_ROWS_MASK) + 1)
    else:
        raw = scan(spark, linked)
        splits = raw.groupBy(_POSITION, _SPLIT).agg(
            F.count(F.lit(1)).alias(_SPLIT_LINES), F.min(_ROW_ID).alias(_SPLIT_FIRST_ROW)
        )
        earlier_splits = Window.partitionBy(_POSITION).orderBy(_SPLIT)
        offsets = splits.select(
            _POSITION,
            _SPLIT,
            _SPLIT_FIRST_ROW,
            (F.sum(_SPLIT_LINES).over(earlier_splits) - F.col(_SPLIT_LINES)).alias(_LINES_BEFORE),
        )
        numbered = raw.join(F.broadcast(offsets), [_POSITION, _SPLIT]).withColumn(
            _LINE, F.col(_LINES_BEFORE) + F.col(_ROW_ID) - F.col(_SPLIT_FIRST_ROW) + 1
        )
    # Only spaces, tabs and a carriage return. A line that starts with "{" (nearly every event) is
    # not blank: ``btrim``, which copies the line, runs for the others only.
    event = F.col(EVENT_COLUMN)
    blank = ~event.startswith("{") & (F.expr(f"btrim({EVENT_COLUMN}, ' \\t\\r')") == F.lit(""))
    columns = [F.col(EVENT_COLUMN), F.col(SOURCE_FILE_COLUMN), F.col(_LINE).alias(LINE_COLUMN)]
    if batch_of_file is not None:
        columns.append(F.element_at(F.array(*map(F.lit, batch_of_file)), F.col(_POSITION)).alias(BATCH_COLUMN))
    return numbered.where(~blank).select(*columns)
