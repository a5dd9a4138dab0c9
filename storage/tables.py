"""Parquet tables of a run: the archive per step, the rollouts and their evaluations.

Users open them with pyarrow or DuckDB, e.g.
`duckdb.sql("select state_id, reward, parent_id, step from 'runs/x/archive/0005.parquet'")`.
Constructions are stored as JSON text (`construction_json`), never pickled.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from storage.atomic import atomic_path

ARCHIVE_SCHEMA = pa.schema(
    [
        ("state_id", pa.string()),
        ("parent_id", pa.string()),
        ("step", pa.int32()),
        ("reward", pa.float64()),
        ("is_seed", pa.bool_()),
        ("lineage", pa.list_(pa.string())),
        ("code", pa.string()),
        ("construction_json", pa.string()),
        ("observation", pa.string()),
        ("best_child_reward", pa.float64()),
        ("visits", pa.int64()),
    ]
)


def _write(path: Path, table: pa.Table) -> None:
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def write_archive(path: Path, records: list[dict[str, Any]], total_expansions: int) -> None:
    """Write archive records (discover.archive.Archive.to_records) with T in the file metadata."""
    rows = {name: [] for name in ARCHIVE_SCHEMA.names}
    for r in records:
        rows["state_id"].append(r["id"])
        rows["parent_id"].append(r["parent_id"])
        rows["step"].append(r["step"])
        rows["reward"].append(float(r["reward"]))
        rows["is_seed"].append(bool(r["is_seed"]))
        rows["lineage"].append(list(r["lineage"]))
        rows["code"].append(r["code"])
        rows["construction_json"].append(json.dumps(r["construction"], allow_nan=True))
        rows["observation"].append(r["observation"])
        rows["best_child_reward"].append(r["best_child_reward"])
        rows["visits"].append(int(r["visits"]))
    table = pa.Table.from_pydict(rows, schema=ARCHIVE_SCHEMA)
    table = table.replace_schema_metadata({b"total_expansions": str(int(total_expansions)).encode()})
    _write(path, table)


def read_archive(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The records and T written by write_archive, in the same order."""
    table = pq.read_table(path)
    meta = table.schema.metadata or {}
    total = int(meta.get(b"total_expansions", b"0"))
    records = []
    for row in table.to_pylist():
        records.append(
            {
                "id": row["state_id"],
                "parent_id": row["parent_id"],
                "step": row["step"],
                "reward": row["reward"],
                "is_seed": row["is_seed"],
                "lineage": tuple(row["lineage"]),
                "code": row["code"],
                "construction": json.loads(row["construction_json"]),
                "observation": row["observation"],
                "best_child_reward": row["best_child_reward"],
                "visits": row["visits"],
            }
        )
    return records, total


ROLLOUT_SCHEMA = pa.schema(
    [
        ("group", pa.int32()),
        ("index", pa.int32()),
        ("parent_id", pa.string()),
        ("prompt_ids", pa.list_(pa.int32())),
        ("completion_ids", pa.list_(pa.int32())),
        ("sampler_logprobs", pa.list_(pa.float32())),
        ("loss_mask", pa.list_(pa.int8())),
        ("text", pa.string()),
        ("answer", pa.string()),
        ("forced", pa.bool_()),
        ("finish_reason", pa.string()),
    ]
)

EVALUATION_SCHEMA = pa.schema(
    [
        ("group", pa.int32()),
        ("index", pa.int32()),
        ("child_id", pa.string()),
        ("parent_id", pa.string()),
        ("reward", pa.float64()),
        ("valid", pa.bool_()),
        ("reason", pa.string()),
        ("code", pa.string()),
        ("construction_json", pa.string()),
        ("metrics_json", pa.string()),
        ("logs", pa.string()),
        ("seconds", pa.float64()),
    ]
)


def write_rows(path: Path, rows: list[dict[str, Any]], schema: pa.Schema) -> None:
    """Write row dicts under a fixed schema (rollouts or evaluations)."""
    columns = {name: [row[name] for row in rows] for name in schema.names}
    _write(path, pa.Table.from_pydict(columns, schema=schema))


def read_rows(path: Path) -> list[dict[str, Any]]:
    return pq.read_table(path).to_pylist()
