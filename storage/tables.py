"""Parquet tables of records: one generic writer and reader for any record dataclass.

A record (discover/records.py: a rollout, an evaluation; discover/archive.py: a state) is declared
once as a dataclass; its Parquet schema is derived from its fields here:

- `str` -> string, `int` -> int64, `float` -> float64, `bool` -> bool, `list[int]` -> list<int64>,
  `list[float]` -> list<float64>, `tuple[str, ...]` / `list[str]` -> list<string>, `X | None`
  -> the type of X (nullable);
- a field's metadata may narrow the Arrow type (`{"arrow": pa.int32()}`), rename the column
  (`{"column": "state_id"}`), or store plain data as JSON text (`{"json": True}`; column
  `<name>_json`: constructions and metrics are never pickled).

Users open the tables with pyarrow or DuckDB, e.g.
`duckdb.sql("select state_id, reward, parent_id, step from 'runs/x/archive/0005.parquet'")`.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq

from storage.atomic import atomic_path

R = TypeVar("R")

_SCALARS = {str: pa.string(), int: pa.int64(), float: pa.float64(), bool: pa.bool_()}


def _arrow_type(annotation: Any) -> pa.DataType:
    origin = typing.get_origin(annotation)
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if origin in (typing.Union, types.UnionType) and len(args) == 1:
        return _arrow_type(args[0])
    if origin in (list, tuple) and args:
        return pa.list_(_arrow_type(args[0]))
    if annotation in _SCALARS:
        return _SCALARS[annotation]
    raise TypeError(f"no Parquet type for {annotation!r}; give the field metadata {{'arrow': ...}} or {{'json': True}}")


@dataclasses.dataclass(frozen=True)
class _Column:
    field: str
    column: str
    type: pa.DataType
    json: bool
    as_tuple: bool


@lru_cache(maxsize=None)
def _columns(cls: type) -> tuple[_Column, ...]:
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        meta = f.metadata
        as_json = bool(meta.get("json"))
        if as_json:
            arrow, column = pa.string(), meta.get("column", f"{f.name}_json")
        else:
            arrow, column = meta.get("arrow") or _arrow_type(hints[f.name]), meta.get("column", f.name)
        out.append(_Column(f.name, column, arrow, as_json, typing.get_origin(hints[f.name]) is tuple))
    return tuple(out)


def schema_of(cls: type) -> pa.Schema:
    """The Parquet schema of a record dataclass."""
    return pa.schema([(c.column, c.type) for c in _columns(cls)])


def write_records(path: Path, records: list[Any], cls: type, metadata: dict[str, str] | None = None) -> None:
    """Write `records` (instances of `cls`) atomically, with optional key/value file metadata."""
    columns: dict[str, list[Any]] = {c.column: [] for c in _columns(cls)}
    for record in records:
        for c in _columns(cls):
            value = getattr(record, c.field)
            if c.json:
                value = json.dumps(value, allow_nan=True)
            elif c.as_tuple:
                value = list(value)
            columns[c.column].append(value)
    table = pa.Table.from_pydict(columns, schema=schema_of(cls))
    if metadata:
        table = table.replace_schema_metadata({k.encode(): str(v).encode() for k, v in metadata.items()})
    with atomic_path(Path(path)) as tmp:
        pq.write_table(table, tmp)


def read_records(path: Path, cls: type[R]) -> tuple[list[R], dict[str, str]]:
    """The records and file metadata written by `write_records`, in the same order."""
    table = pq.read_table(path)
    meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
    columns = _columns(cls)
    records = []
    for row in table.to_pylist():
        values = {}
        for c in columns:
            value = row[c.column]
            if c.json:
                value = json.loads(value)
            elif c.as_tuple:
                value = tuple(value)
            values[c.field] = value
        records.append(cls(**values))
    return records, meta


def write_rows(path: Path, rows: list[dict[str, Any]], schema: pa.Schema) -> None:
    """Write plain row dicts under a fixed schema (derived tables such as re-evaluations)."""
    columns = {name: [row[name] for row in rows] for name in schema.names}
    with atomic_path(Path(path)) as tmp:
        pq.write_table(pa.Table.from_pydict(columns, schema=schema), tmp)


def read_rows(path: Path) -> list[dict[str, Any]]:
    return pq.read_table(path).to_pylist()
