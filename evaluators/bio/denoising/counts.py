"""The counts a denoising run is scored on (docs/method.md §5d): where they come from and how they are filtered.

- The offline default, `pbmc68k_reduced`: the 700 PBMCs x 765 genes that scanpy's wheel ships.
  Its `raw.X` holds log1p(counts / total * 1e4) and `obs.n_counts` the totals, so
  round(expm1(raw.X) * n_counts / 1e4) gives back the integer counts (`pbmc68k_counts`).
- Any local `.h5ad` holding raw counts (the paper's datasets: pancreas inDrop1, PBMC 1k, Tabula
  Muris Senis lung, as OpenProblems stores them): `layer` says where the counts are and
  `keep_obs` keeps some cells only (the paper trains on the pancreas cells whose `tech` is inDrop1).

Then OpenProblems' filters: genes seen in at least one cell, then cells with at least 2 counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

OFFLINE_DEFAULT = "pbmc68k_reduced"
INTEGRAL_TOLERANCE = 1e-6  # how far from an integer a value of an .h5ad's counts may be (float storage)
RECOVERY_TOLERANCE = 0.25  # pbmc68k_reduced stores raw.X rounded; recovered counts sit within this of integers
MIN_CELLS_PER_GENE = 1  # OpenProblems' filter_genes_cells: sc.pp.filter_genes(min_cells=1)
MIN_COUNTS_PER_CELL = 2  # ... then sc.pp.filter_cells(min_counts=2)


@dataclass(frozen=True)
class Counts:
    """A cells x genes matrix of integer counts and where it came from."""

    X: np.ndarray  # int64, dense, cells x genes
    source: str  # "pbmc68k_reduced" or the .h5ad path, with the layer and the cell selection

    @property
    def shape(self) -> tuple[int, int]:
        return self.X.shape


def pbmc68k_counts() -> tuple[np.ndarray, float]:
    """The integer counts behind scanpy's pbmc68k_reduced, and the largest distance of a recovered
    value from its integer (the recovery is exact when that is well below 1/2)."""
    import scanpy as sc

    adata = sc.datasets.pbmc68k_reduced()
    logged = _dense(adata.raw.X).astype(np.float64)
    totals = adata.obs["n_counts"].to_numpy(dtype=np.float64)
    values = np.expm1(logged) * totals[:, None] / 1e4  # invert log1p(counts / total * 1e4)
    counts = np.round(values)
    return counts.astype(np.int64), float(np.max(np.abs(values - counts), initial=0.0))


def load_counts(data: str = OFFLINE_DEFAULT, layer: str = "X", keep_obs: dict[str, list[Any]] | None = None) -> Counts:
    """The filtered counts of `data` ("pbmc68k_reduced" or a path to an .h5ad file).

    Raises ValueError naming the problem and the fix: a missing file, an unknown layer or obs
    column, a cell selection that keeps nothing, counts that are not non-negative integers.
    """
    check_source(data, layer, keep_obs)
    if data == OFFLINE_DEFAULT:
        X, deviation = pbmc68k_counts()
        if deviation > RECOVERY_TOLERANCE:
            raise ValueError(
                f"the counts recovered from scanpy's pbmc68k_reduced are {deviation:.3f} away from integers; "
                "this scanpy release ships another version of the dataset"
            )
        return Counts(filter_counts(X), OFFLINE_DEFAULT)
    X = _read_h5ad_counts(Path(data).expanduser(), layer, keep_obs)
    selection = f", cells with {keep_obs}" if keep_obs else ""
    return Counts(filter_counts(X), f"{data} ({layer}{selection})")


def check_source(data: str, layer: str = "X", keep_obs: dict[str, list[Any]] | None = None) -> None:
    """What can be checked without reading the counts (a run's pre-flight): the file exists."""
    if data == OFFLINE_DEFAULT:
        if layer != "X" or keep_obs:
            raise ValueError(f"layer and keep_obs apply to .h5ad files, not to the offline default {OFFLINE_DEFAULT!r}")
        return
    path = Path(data).expanduser()
    if path.suffix != ".h5ad":
        raise ValueError(f"data must be {OFFLINE_DEFAULT!r} or a path to an .h5ad file, got {data!r}")
    if not path.is_file():
        raise ValueError(f"data file {data!r} does not exist (relative paths are taken from {Path.cwd()})")
    if keep_obs is not None and (not isinstance(keep_obs, dict) or not all(isinstance(v, (list, tuple)) for v in keep_obs.values())):
        raise ValueError(f"keep_obs must map obs columns to lists of values, e.g. {{'tech': ['inDrop1']}}; got {keep_obs!r}")


def filter_counts(X: np.ndarray) -> np.ndarray:
    """OpenProblems' filters, in its order: genes seen in >= 1 cell, then cells with >= 2 counts."""
    X = X[:, (X > 0).sum(axis=0) >= MIN_CELLS_PER_GENE]
    return np.ascontiguousarray(X[X.sum(axis=1) >= MIN_COUNTS_PER_CELL])


def _read_h5ad_counts(path: Path, layer: str, keep_obs: dict[str, list[Any]] | None) -> np.ndarray:
    import anndata

    adata = anndata.read_h5ad(path)
    if keep_obs:
        mask = np.ones(adata.n_obs, dtype=bool)
        for column, values in keep_obs.items():
            if column not in adata.obs:
                raise ValueError(f"keep_obs: {path} has no obs column {column!r}; its columns: {', '.join(map(str, adata.obs.columns))}")
            mask &= adata.obs[column].isin(list(values)).to_numpy()
        if not mask.any():
            raise ValueError(f"keep_obs {keep_obs} keeps no cell of {path}")
        adata = adata[mask]
    if layer == "X":
        matrix = adata.X
    elif layer == "raw.X":
        if adata.raw is None:
            raise ValueError(f"{path} has no raw; choose layer 'X' or one of its layers: {', '.join(adata.layers) or 'none'}")
        matrix = adata.raw.X
    elif layer in adata.layers:
        matrix = adata.layers[layer]
    else:
        raise ValueError(f"{path} has no layer {layer!r}; choose 'X', 'raw.X' or one of: {', '.join(adata.layers) or 'none'}")
    values = _dense(matrix).astype(np.float64)
    if not np.isfinite(values).all() or values.min(initial=0.0) < 0:
        raise ValueError(f"{path} layer {layer!r} holds negative or non-finite values: raw counts are needed")
    deviation = float(np.max(np.abs(values - np.round(values)), initial=0.0))
    if deviation > INTEGRAL_TOLERANCE:
        raise ValueError(
            f"{path} layer {layer!r} does not hold integer counts (a value is {deviation:.3g} from an integer); "
            "molecular cross-validation needs raw UMI counts: choose the layer that holds them (often 'counts')"
        )
    return np.round(values).astype(np.int64)


def _dense(matrix: Any) -> np.ndarray:
    return np.asarray(matrix.toarray() if hasattr(matrix, "toarray") else matrix)
