"""Python user-defined scalar functions, called once per batch on whole columns.

A pipeline declares one with Flink's statement::

    CREATE FUNCTION count_char AS 'my_udfs.count_char' LANGUAGE PYTHON;

and ``my_udfs`` (importable on the job's ``PYTHONPATH``) defines it, declaring its result
type with ``@udf``::

    import pyarrow as pa
    import pyarrow.compute as pc
    from tidemark.udf import udf

    @udf(result_type="BIGINT")
    def count_char(s: pa.Array, c: pa.Array) -> pa.Array:
        ...

Each argument is a ``pyarrow.Array`` with one value per row of the batch (NULLs included);
the function returns one array (or anything ``pyarrow.array`` takes) of the same length.
It must be deterministic: a retraction is computed again and must give the row it retracts.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable
from typing import Any

from tidemark.engine.types import SqlType

_RESULT_TYPE = "__tidemark_result_type__"


def udf(result_type: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Declare a function's SQL result type (``"BIGINT"``, ``"DECIMAL(10, 2)"``, ...)."""

    def mark(fn: Callable[..., Any]) -> Callable[..., Any]:
        setattr(fn, _RESULT_TYPE, result_type)
        return fn

    return mark


class UdfError(ValueError):
    """A function could not be loaded, declared or called; the message names it."""


@functools.lru_cache(maxsize=None)
def load(path: str) -> tuple[Callable[..., Any], SqlType]:
    """The function at ``module.function`` and its declared result type."""
    from tidemark.engine.sql import parse_type_text

    module_name, _, name = path.rpartition(".")
    if not module_name:
        raise UdfError(f"'{path}' is not a 'module.function' path")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise UdfError(f"cannot import module '{module_name}' ({e}); it must be importable on the job's PYTHONPATH") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise UdfError(f"module '{module_name}' has no function '{name}'")
    declared = getattr(fn, _RESULT_TYPE, None)
    if declared is None:
        raise UdfError(f"'{path}' declares no result type: decorate it with @tidemark.udf.udf(result_type='...')")
    try:
        return fn, parse_type_text(declared)
    except Exception as e:
        raise UdfError(f"'{path}': result type {declared!r} is not a SQL type ({e})") from None


@functools.lru_cache(maxsize=None)
def argument_type(type_text: str) -> Any:
    """The Arrow type a UDF receives for an argument of SQL type ``type_text``: integers as
    int64 and DECIMAL(p, s) as decimal128(38, s), as the vectorized calc hands them over."""
    import pyarrow as pa

    from tidemark.engine.arrow_types import arrow_type
    from tidemark.engine.sql import parse_type_text
    from tidemark.engine.types import INTEGRAL

    t = parse_type_text(type_text)
    if t.name in INTEGRAL:
        return pa.int64()
    if t.name == "DECIMAL":
        return pa.decimal128(38, t.params[1])
    return arrow_type(t)


def check_arity(path: str, n_args: int) -> None:
    """UdfError when the function cannot take ``n_args`` positional arguments."""
    fn, _ = load(path)
    try:
        inspect.signature(fn).bind(*range(n_args))
    except TypeError as e:
        raise UdfError(f"'{path}' cannot be called with {n_args} argument(s): {e}") from None
    except ValueError:
        return  # no signature to check (a builtin): the call will tell


def call(name: str, path: str, args: list[Any], rows: int) -> Any:
    """``path``'s function on one batch's argument arrays: an Arrow array of ``rows`` values."""
    import pyarrow as pa

    fn, result_type = load(path)
    from tidemark.engine.arrow_types import arrow_type

    try:
        out = fn(*args)
        array = out if isinstance(out, (pa.Array, pa.ChunkedArray)) else pa.array(out)
        array = array.cast(arrow_type(result_type))
    except Exception as e:
        raise UdfError(f"function {name} ('{path}') failed on a batch: {type(e).__name__}: {e}") from None
    if len(array) != rows:
        raise UdfError(f"function {name} ('{path}') returned {len(array)} values for {rows} rows")
    return array
