"""Records on disk: one generic Parquet writer and reader, and JSON, for any record dataclass.

A record (evaluators/base.py `EvalResult`; discover/records.py `State`, `Rollout`, `Evaluation`,
`Reevaluation`) is declared once as a dataclass; its Parquet schema is derived from its fields:

- `str` -> string, `int` -> int64, `float` -> float64, `bool` -> bool, `list[int]` -> list<int64>,
  `list[float]` -> list<float64>, `tuple[str, ...]` / `list[str]` -> list<string>, `X | None`
  -> the type of X (nullable);
- a field's metadata may narrow the Arrow type (`{"arrow": pa.int32()}`), rename the column
  (`{"column": "state_id"}`), store plain data as JSON text (`{"json": True}`; column
  `<name>_json`: constructions and metrics are never pickled), spread a dict of numbers over one
  float64 column per key (`{"expand": True}`: a re-evaluation's runtime per benchmark shape), or
  name the columns an older version wrote it to (`{"formerly": ("logs",)}`).

Versions: a record class may declare `SCHEMA_VERSION: ClassVar[int]`; the file's metadata keeps it
(`schema_version`). Reading a file written by an older version fills each field its file lacks
from the field's default (an error names the field when it has none), and reads a renamed field
from its former column; a file from a newer version is refused with a message saying so. Adding a
field with a default to a record therefore never breaks resuming a run written before it: bump
`SCHEMA_VERSION`, and docs/architecture.md ("Records") says when that is needed.

Users open the tables with pyarrow or DuckDB, e.g.
`duckdb.sql("select state_id, reward, parent_id, step from 'runs/x/archive/0005.parquet'")`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq

from storage.atomic import atomic_path

R = TypeVar("R")

VERSION_KEY = "schema_version"
RECORD_KEY = "record"
_SCALARS = {str: pa.string(), int: pa.int64(), float: pa.float64(), bool: pa.bool_()}
_MISSING = dataclasses.MISSING


class SchemaError(ValueError):
    """A stored record that this version cannot read (too new, or a required field missing)."""


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
    expand: bool
    as_tuple: bool
    formerly: tuple[str, ...]
    default: Any  # a value, a zero-argument factory (has_factory), or _MISSING
    has_factory: bool

    def default_value(self) -> Any:
        return self.default() if self.has_factory else self.default


_COLUMNS: dict[type, tuple[_Column, ...]] = {}


def _columns(cls: type) -> tuple[_Column, ...]:
    """The columns of a record class, derived once per class."""
    if cls not in _COLUMNS:
        _COLUMNS[cls] = _derive_columns(cls)
    return _COLUMNS[cls]


def _derive_columns(cls: type) -> tuple[_Column, ...]:
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        meta = f.metadata
        as_json, expand = bool(meta.get("json")), bool(meta.get("expand"))
        if expand:
            arrow, column = pa.float64(), ""  # one column per key, named by the key
        elif as_json:
            arrow, column = pa.string(), meta.get("column", f"{f.name}_json")
        else:
            arrow, column = meta.get("arrow") or _arrow_type(hints[f.name]), meta.get("column", f.name)
        factory = f.default_factory is not _MISSING
        default = f.default_factory if factory else f.default
        out.append(
            _Column(
                f.name,
                column,
                arrow,
                as_json,
                expand,
                typing.get_origin(hints[f.name]) is tuple,
                tuple(meta.get("formerly", ())),
                default,
                factory,
            )
        )
    return tuple(out)


def schema_version(cls: type) -> int:
    """The record class's schema version (1 when it declares none)."""
    return int(getattr(cls, "SCHEMA_VERSION", 1))


def schema_of(cls: type, expanded: tuple[str, ...] = ()) -> pa.Schema:
    """The Parquet schema of a record dataclass (`expanded`: the keys of its expanded dict field)."""
    fields: list[tuple[str, pa.DataType]] = []
    for c in _columns(cls):
        if c.expand:
            fields.extend((key, pa.float64()) for key in expanded)
        else:
            fields.append((c.column, c.type))
    return pa.schema(fields)


def _expanded_keys(records: list[Any], cls: type) -> tuple[str, ...]:
    fixed = {c.column for c in _columns(cls) if not c.expand}
    keys: dict[str, None] = {}
    for c in _columns(cls):
        if c.expand:
            for record in records:
                for key in getattr(record, c.field):
                    if key in fixed:
                        raise ValueError(f"metric {key!r} of {cls.__name__}.{c.field} would shadow a column of the table")
                    keys[key] = None
    return tuple(sorted(keys))


def write_records(path: Path, records: list[Any], cls: type, metadata: dict[str, Any] | None = None) -> None:
    """Write `records` (instances of `cls`) atomically, with the schema version and optional
    key/value file metadata."""
    expanded = _expanded_keys(records, cls)
    schema = schema_of(cls, expanded)
    columns: dict[str, list[Any]] = {name: [] for name in schema.names}
    for record in records:
        for c in _columns(cls):
            value = getattr(record, c.field)
            if c.expand:
                for key in expanded:
                    number = value.get(key)
                    columns[key].append(None if number is None else float(number))
                continue
            if c.json:
                value = json.dumps(value, allow_nan=True)
            elif c.as_tuple:
                value = list(value)
            columns[c.column].append(value)
    table = pa.Table.from_pydict(columns, schema=schema)
    meta = {VERSION_KEY: schema_version(cls), RECORD_KEY: cls.__name__, **(metadata or {})}
    table = table.replace_schema_metadata({k.encode(): str(v).encode() for k, v in meta.items()})
    with atomic_path(Path(path)) as tmp:
        pq.write_table(table, tmp)


def _check_version(cls: type, found: int, source: object) -> None:
    if found > schema_version(cls):
        raise SchemaError(
            f"{source} holds {cls.__name__} records of schema version {found}, newer than this version of "
            f"ttt-discover reads ({schema_version(cls)}); upgrade ttt-discover to read it"
        )


def _value(c: _Column, row: dict[str, Any], cls: type, source: object) -> Any:
    """A field's value from a row, from a former column, or from its default."""
    for name in (c.column, *c.formerly):
        if name in row:
            value = row[name]
            if c.json:
                return json.loads(value) if isinstance(value, str) else value
            if c.as_tuple:
                return tuple(value)
            return value
    if c.default is _MISSING:
        raise SchemaError(f"{source} has no column {c.column!r} for the field {cls.__name__}.{c.field}, which has no default")
    return c.default_value()


def read_records(path: Path, cls: type[R]) -> tuple[list[R], dict[str, str]]:
    """The records and file metadata written by `write_records` (this version or an older one),
    in the same order."""
    table = pq.read_table(path)
    meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
    _check_version(cls, int(meta.get(VERSION_KEY, 1)), path)
    columns = _columns(cls)
    fixed = {c.column for c in columns if not c.expand} | {n for c in columns for n in c.formerly}
    extra = [name for name in table.column_names if name not in fixed]
    records = []
    for row in table.to_pylist():
        values = {}
        for c in columns:
            if c.expand:
                values[c.field] = {k: row[k] for k in extra if row[k] is not None and not math.isnan(row[k])}
            else:
                values[c.field] = _value(c, row, cls, path)
        records.append(cls(**values))
    return records, meta


def record_to_json(record: Any) -> dict[str, Any]:
    """A record as a JSON object: its fields by name, plus its schema version."""
    out: dict[str, Any] = {VERSION_KEY: schema_version(type(record))}
    for c in _columns(type(record)):
        value = getattr(record, c.field)
        out[c.field] = list(value) if c.as_tuple else value
    return out


def record_from_json(data: dict[str, Any], cls: type[R], source: object = "a stored record") -> R:
    """The inverse of `record_to_json`, also for objects written by an older version."""
    _check_version(cls, int(data.get(VERSION_KEY, 1)), source)
    values = {}
    for c in _columns(cls):
        found = next((name for name in (c.field, *c.formerly) if name in data), None)
        if found is not None:
            values[c.field] = tuple(data[found]) if c.as_tuple else data[found]
        elif c.default is _MISSING:
            raise SchemaError(f"{source} has no field {c.field!r} of {cls.__name__}, which has no default")
        else:
            values[c.field] = c.default_value()
    return cls(**values)
