"""What a sandboxed run produced, read back safely: capped log tails, the JSON value of
output.json (never followed through a link, never unpickled), and a one-line reason for a failure.
Shared by the process and docker backends."""

from __future__ import annotations

import errno
import json
import os
import signal
import stat
from pathlib import Path
from typing import Any, BinaryIO

from evaluators.sandbox.base import SandboxLimits

EXIT_NO_ENTRY, EXIT_BAD_VALUE = 3, 4  # harness.py's exit codes whose stderr line is the reason


def tail(f: BinaryIO, cap: int) -> tuple[bytes, bool]:
    """The last `cap` bytes of an open file, and whether anything was cut."""
    size = os.fstat(f.fileno()).st_size
    f.seek(max(0, size - cap))
    return f.read(cap), size > cap


def read_logs(out: BinaryIO, err: BinaryIO, cap: int) -> tuple[str, str]:
    """stdout then stderr, together at most `cap` characters (stderr keeps at least half)."""
    out_b, out_cut = tail(out, cap)
    err_b, err_cut = tail(err, cap)
    return compose_logs(out_b, out_cut, err_b, err_cut, cap)


def compose_logs(out_b: bytes, out_cut: bool, err_b: bytes, err_cut: bool, cap: int) -> tuple[str, str]:
    """Logs from the tails of stdout and stderr (shared with the docker backend)."""
    keep_err = min(len(err_b), max(cap // 2, cap - len(out_b)))
    err_b = err_b[len(err_b) - keep_err :]
    keep_out = min(len(out_b), cap - keep_err)
    out_cut = out_cut or keep_out < len(out_b)
    out_b = out_b[len(out_b) - keep_out :]
    out_s = out_b.decode("utf-8", errors="replace")
    err_s = err_b.decode("utf-8", errors="replace")
    logs = out_s + ("\n" if out_s and err_s and not out_s.endswith("\n") else "") + err_s
    if out_cut or err_cut:
        logs = "[output truncated]\n" + logs
    logs = logs[-cap:] if cap > 0 else ""
    lines = [line.strip() for line in err_s.splitlines() if line.strip()]
    return logs, (lines[-1][:500] if lines else "")


def read_output(path: Path, cap: int) -> tuple[Any, str]:
    """(value, "") or (None, reason). Refuses links, pipes and files over `cap` bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None, "program exited without returning a value (no output.json)"
    except OSError as e:
        if e.errno == errno.ELOOP:
            return None, "output.json is a symbolic link"
        return None, f"could not read the return value: {e}"
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, "output.json is not a regular file"
        if st.st_size > cap:
            return None, f"return value too large: {st.st_size} bytes > max_output_bytes={cap}"
        data = f.read(cap + 1)
    return parse_output(data, cap)


def parse_output(data: bytes, cap: int) -> tuple[Any, str]:
    """(value, "") or (None, reason) from output.json's bytes (shared with the docker backend)."""
    if len(data) > cap:
        return None, f"return value too large: over max_output_bytes={cap}"
    try:
        return json.loads(data.decode("utf-8")), ""  # NaN/Infinity decode to floats
    except (ValueError, RecursionError) as e:
        return None, f"return value is not valid JSON: {str(e)[:200]}"


def failure_reason(returncode: int, last_err_line: str, limits: SandboxLimits) -> str:
    if returncode < 0:
        sig = -returncode
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        if sig == signal.SIGXCPU:
            return f"killed by signal {name}: CPU time limit exceeded"
        if sig == signal.SIGXFSZ:
            return f"killed by signal {name}: file size limit ({limits.max_file_mb} MB) exceeded"
        if sig in (signal.SIGKILL, signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS):
            return f"killed by signal {name} (possibly the memory limit of {limits.memory_mb} MB)"
        return f"killed by signal {name}"
    if returncode in (EXIT_NO_ENTRY, EXIT_BAD_VALUE) and last_err_line:
        return last_err_line
    reason = f"exit code {returncode}" + (f": {last_err_line}" if last_err_line else "")
    if "MemoryError" in last_err_line:
        return f"memory limit ({limits.memory_mb} MB) exceeded: {reason}"
    return reason
