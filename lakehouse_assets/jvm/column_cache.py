"""Spark columns built once per JVM: expressions that depend only on a stream's settings and a table's schema.

In classic PySpark every function and every method that builds a column is a py4j round trip to
the JVM, and one more when Python drops the column (py4j's garbage collection). A writer's round
built some 4,700 of them for tens of rows, two fifths of its CPU (``docs/benchmarks.md``). A
column is an unresolved expression, bound to no DataFrame or session, so the columns built for a
stream and a table schema serve every batch of them while the JVM lives.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from typing import ParamSpec, TypeVar

from pydantic import BaseModel
from pyspark import SparkContext
from pyspark.sql import types as T

# Distinct streams and schemas a process converts at once; a changed schema makes a new entry.
MAX_ENTRIES = 256
Arguments = ParamSpec("Arguments")
Built = TypeVar("Built")


def _key(value: object) -> Hashable:
    """A hashable stand-in for a builder's argument, equal when the columns built would be: a
    configuration model by its JSON, a Spark type by its JSON (with the fields' metadata)."""
    if isinstance(value, BaseModel):
        return (type(value).__name__, value.model_dump_json())
    if isinstance(value, T.DataType):
        return value.json()
    if isinstance(value, (list, tuple)):
        return tuple(_key(item) for item in value)
    if isinstance(value, Mapping):
        return tuple(sorted((name, _key(item)) for name, item in value.items()))
    if isinstance(value, T.StructField):
        return _key(T.StructType([value]))
    return value  # a str, number, bool or None


def cached_columns(build: Callable[Arguments, Built]) -> Callable[Arguments, Built]:
    """``build`` (a pure function of its arguments that returns columns) called once per JVM and
    arguments; later calls return the same columns. The JVM is told by PySpark's gateway to it (the
    key holds it, so its identity is never reused): a process attached to another JVM (a Spark host
    restarted) builds them again."""
    entries: OrderedDict[Hashable, Built] = OrderedDict()
    lock = threading.Lock()

    @functools.wraps(build)
    def cached(*args: Arguments.args, **kwargs: Arguments.kwargs) -> Built:
        key = (SparkContext._gateway, _key(args), _key(tuple(sorted(kwargs.items()))))
        with lock:
            if key in entries:
                entries.move_to_end(key)
                return entries[key]
        built = build(*args, **kwargs)
        with lock:
            entries[key] = built
            if len(entries) > MAX_ENTRIES:
                entries.popitem(last=False)
        return built

    return cached
