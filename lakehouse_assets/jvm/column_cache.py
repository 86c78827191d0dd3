"""Spark expressions built once per JVM: those that depend only on a stream's settings and a table's schema.

In classic PySpark every function and every method that builds a column is a py4j round trip to
the JVM, and one more when Python drops the column (py4j's garbage collection): a warm round of
two streams sent 4,720 of them, three quarters building the same expressions for every batch
(``docs/benchmarks.md``). An expression that names no output (no alias) is unresolved and bound to
no DataFrame, so the ones built for a stream and a table schema serve every batch of them while
the JVM lives. Output names are given per use (:func:`named`): an alias carries an expression id,
and two DataFrames whose columns shared ids would be confused in a union or a join of them.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from typing import ParamSpec, TypeVar

from pydantic import BaseModel
from pyspark import SparkContext
from pyspark.sql import Column
from pyspark.sql import types as T

# Distinct streams and schemas a process converts at once; a changed schema makes a new entry.
MAX_ENTRIES = 256
Arguments = ParamSpec("Arguments")
Built = TypeVar("Built")
Named = tuple[tuple[str, Column], ...]
"""Expressions with the output name each is selected under, in order."""


def named(expressions: Named) -> list[Column]:
    """``expressions`` as the columns to select, each aliased to its name."""
    return [expression.alias(name) for name, expression in expressions]


def _key(value: object) -> Hashable:
    """A hashable stand-in for a builder's argument, equal when the expressions built would be: a
    configuration model by its JSON, a Spark type (a field too) by its JSON, with the fields'
    metadata. TypeError for any other kind of value than these, containers of them and plain ones."""
    if isinstance(value, BaseModel):
        return (type(value).__name__, value.model_dump_json())
    if isinstance(value, T.DataType):
        return value.json()
    if isinstance(value, (list, tuple)):
        return tuple(_key(item) for item in value)
    if isinstance(value, Mapping):
        return tuple(sorted((name, _key(item)) for name, item in value.items()))
    if value is None or isinstance(value, (str, int, float)):
        return value
    raise TypeError(f"no cache key for a {type(value).__name__}: the expressions built from it could differ")


def cached_columns(build: Callable[Arguments, Built]) -> Callable[Arguments, Built]:
    """``build`` (a pure function of its arguments that builds expressions) called once per JVM and
    arguments; later calls return what that call built. The JVM is the one PySpark's gateway leads
    to (the key holds the gateway, so its identity is never reused)."""
    entries: OrderedDict[Hashable, Built] = OrderedDict()
    lock = threading.Lock()

    @functools.wraps(build)
    def cached(*args: Arguments.args, **kwargs: Arguments.kwargs) -> Built:
        key = (SparkContext._gateway, _key(args), _key(kwargs))
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
