"""The version of the code a task really runs, for cache keys: which project modules a module
needs, and one digest of their source.

`module_closure("discover.steps")` is the transitive closure of the project modules that
discover/steps.py imports, read from the import statements of their source with `ast` (imports
inside functions too; relative imports resolved; `from pkg import submodule` counted as the
submodule; each module's parent packages counted, since importing it runs their `__init__`), plus
the modules that string constants name in the form "pkg.module" or "pkg.module:attribute", which is
how evaluators/registry.py imports each problem. Nothing is imported to find them.

`source_digest(names)` is a sha256 over each module's name and its source file's bytes, in sorted
order. Where a module has no source (installed without .py files) its compiled code stands in (the
.pyc's marshalled code, without the header that holds a timestamp), and failing that the installed
distribution's version. A module whose source cannot be read has unknown imports: the closure then
takes every module of the packages, so a cache key can only be too cautious, never stale.

Both are cached per process: the code of a running process does not change under it.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import importlib.util
from collections.abc import Iterable
from functools import cache
from pathlib import Path

PACKAGES = ("discover", "evaluators", "storage")
DISTRIBUTION = "ttt-discover"
_PYC_HEADER = 16  # magic, flags, then mtime and size or a source hash (PEP 552)

__all__ = ["PACKAGES", "module_closure", "source_digest"]


def module_closure(module_name: str, packages: Iterable[str] = PACKAGES) -> list[str]:
    """`module_name` and every project module (in `packages`) it needs, transitively; sorted."""
    return list(_closure(module_name, tuple(sorted(packages))))


def source_digest(module_names: Iterable[str]) -> str:
    """A sha256 hex digest over each module's name and source bytes, in sorted order."""
    h = hashlib.sha256()
    for name in sorted(set(module_names)):
        h.update(name.encode() + b"\0")
        h.update(_module_bytes(name))
        h.update(b"\0")
    return h.hexdigest()


# -- finding modules without importing them ------------------------------------------------------


@cache
def _package_dirs(top: str) -> tuple[Path, ...]:
    """The folders of a top-level package (found without importing it); () when it is not there."""
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        return ()
    return tuple(Path(p) for p in spec.submodule_search_locations)


@cache
def _locate(name: str) -> tuple[Path | None, bool]:
    """(the module's file, whether it is a package): its source, else a sourceless .pyc beside
    where the source would be; (None, False) when `name` is no module of its package."""
    top, *rest = name.split(".")
    for base in _package_dirs(top):
        path = base.joinpath(*rest)
        for candidate, is_pkg in (
            (path / "__init__.py", True),
            (path.with_suffix(".py"), False),
            (path / "__init__.pyc", True),
            (path.with_suffix(".pyc"), False),
        ):
            if rest == [] and not is_pkg:
                continue
            if candidate.is_file():
                return candidate, is_pkg
    return None, False


def _is_module(name: str) -> bool:
    return _locate(name)[0] is not None


def _all_modules(packages: tuple[str, ...]) -> set[str]:
    """Every module of `packages` on disk (the cautious closure)."""
    found = set()
    for top in packages:
        for base in _package_dirs(top):
            for f in base.rglob("*.py*"):
                if f.suffix not in (".py", ".pyc") or "__pycache__" in f.parts:
                    continue
                parts = f.relative_to(base).with_suffix("").parts
                if all(p.isidentifier() for p in parts):
                    found.add(".".join((top, *parts[:-1])) if parts[-1] == "__init__" else ".".join((top, *parts)))
    return found


def _with_parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def _imports(name: str, packages: tuple[str, ...]) -> set[str] | None:
    """The project modules that `name`'s source imports or names; None when it has no source."""
    path, is_pkg = _locate(name)
    if path is None or path.suffix != ".py":
        return None
    tree = ast.parse(path.read_bytes(), filename=str(path))
    package = name if is_pkg else name.rpartition(".")[0]
    named: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            named += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                anchor = ".".join(parts[: len(parts) - (node.level - 1)])
                base = f"{anchor}.{node.module}" if node.module else anchor
            else:
                base = node.module or ""
            named.append(base)
            named += [f"{base}.{alias.name}" for alias in node.names if _is_module(f"{base}.{alias.name}")]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "." in node.value:
            dotted = node.value.split(":", 1)[0]  # "evaluators.toy.digits:DigitsProblem"
            if dotted.split(".", 1)[0] in packages and all(p.isidentifier() for p in dotted.split(".")):
                named.append(dotted)
    return {m for n in named if n.split(".", 1)[0] in packages for m in _with_parents(n) if _is_module(m)}


@cache
def _closure(module_name: str, packages: tuple[str, ...]) -> tuple[str, ...]:
    seen: set[str] = set()
    todo = [m for m in _with_parents(module_name) if _is_module(m)] or [module_name]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        found = _imports(name, packages)
        if found is None:  # no source to read: every module of the packages, to be safe
            return tuple(sorted(seen | _all_modules(packages) | set(_with_parents(module_name))))
        todo += sorted(found - seen)
    return tuple(sorted(seen))


# -- the bytes that stand for a module's code ----------------------------------------------------


@cache
def _module_bytes(name: str) -> bytes:
    path, _ = _locate(name)
    if path is not None and path.suffix == ".py":
        return path.read_bytes()
    if path is not None and path.suffix == ".pyc":  # sourceless: the marshalled code object
        return b"pyc:" + path.read_bytes()[_PYC_HEADER:]
    try:
        return b"dist:" + importlib.metadata.version(DISTRIBUTION).encode()
    except importlib.metadata.PackageNotFoundError:
        return b"unknown"
