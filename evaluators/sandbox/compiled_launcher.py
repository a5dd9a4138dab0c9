"""confine.c built once per machine: the launcher of compiled programs and their compiler.

The process backend starts every AtCoder case in a bubblewrap sandbox of its own under a launcher
(drop to the run's uid, limits, seccomp filter, report to the host, exec). confine.py does it under
a bare Python interpreter, whose start-up was most of a case's cost beside a bare run; confine.c
does the same in C. `binary()` compiles it with the host's C compiler (the one the native backend
needs anyway) into the user's cache, keyed by the source's hash, and returns its path; None when
no compiler is found or the build fails, and the runner then uses confine.py (the same
confinement, slower): the sandbox never runs a program unconfined for want of it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

log = logging.getLogger("discover.sandbox")
SOURCE = Path(__file__).with_name("confine.c")
CACHE_ENV = "DISCOVER_LAUNCHER_CACHE"  # where the built launcher is kept (default: the user's cache directory)
BUILD_TIMEOUT_S = 120.0

_lock = threading.Lock()
_built: dict[str, str | None] = {}


def cache_dir() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ttt-discover" / "launcher"


def binary() -> str | None:
    """The built launcher's path (built now when missing), or None where it cannot be built."""
    source = SOURCE.read_bytes()
    digest = hashlib.sha256(source).hexdigest()[:16]
    with _lock:
        if digest not in _built:
            _built[digest] = _build(source, cache_dir() / f"confine-{digest}")
        return _built[digest]


def _build(source: bytes, target: Path) -> str | None:
    if target.is_file() and os.access(target, os.X_OK):
        return str(target)
    compiler = next((c for c in (os.environ.get("CC"), "cc", "gcc", "clang") if c and shutil.which(c)), None)
    if compiler is None:
        log.info("no C compiler: compiled programs start under the Python launcher (confine.py), about 20-40 ms more a case")
        return None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        # built beside its final place and renamed: a concurrent build or a crash never leaves half a file there
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            src = Path(tmp) / "confine.c"
            src.write_bytes(source)
            out = Path(tmp) / "confine"
            done = subprocess.run(
                [compiler, "-O2", "-Wall", "-o", str(out), str(src)], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S
            )
            if done.returncode != 0:
                log.warning("could not build the C launcher (%s): compiled programs start under confine.py", done.stderr.strip()[-500:])
                return None
            out.chmod(0o755)
            os.replace(out, target)
    except (OSError, subprocess.SubprocessError) as err:
        log.warning("could not build the C launcher (%s): compiled programs start under confine.py", err)
        return None
    return str(target)
