"""Runs inside the sandbox for each denoising candidate; never imported on the host.

The sandbox's harness loads this file as the program and calls `denoise(job)` with
job = {"candidate": source, "entry": "magic_denoise", "random_state": int, "train": "train.npy"}.
It reads the train counts from the read-only data directory ($DISCOVER_DATA), runs the candidate's
`magic_denoise(X, random_state=...)` as the released code calls it, and returns the output as the
bytes of an .npy file, base64 in JSON ({"npy": ...}). It writes that output.json itself, streaming
the array, and exits 0 as the harness does after writing it: the matrix of a large dataset is not
copied three times inside the candidate's memory limit. The host decodes it without pickle and
scores it; the held-out counts are never in this process, so nothing here is trusted.

Exit codes follow harness.py: 1 the candidate raised (its traceback on stderr, without this
file's frames, its own lines under the name magic_denoise.py), 3 no `magic_denoise`, 4 a return
value that is not a numeric array.

torch is hidden from imports: it is not among the libraries candidates may use, and on a host
whose environment has it (the process backend runs the host's interpreter), merely importing it
(anndata tries to) maps more address space than the memory limit allows.
"""

import base64
import importlib.machinery
import linecache
import os
import sys
import traceback
import types

HIDDEN = ("torch",)
EXIT_RAISED, EXIT_NO_ENTRY, EXIT_BAD_VALUE = 1, 3, 4
# The name the candidate's tracebacks show: not a file on disk (there, candidate.py is this driver,
# and CPython would take a syntax error's line from it).
CANDIDATE_FILE = "magic_denoise.py"


class _PathFinderWithoutHidden(importlib.machinery.PathFinder):
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            return None
        return super().find_spec(name, path, target)


sys.meta_path[:] = [_PathFinderWithoutHidden if f is importlib.machinery.PathFinder else f for f in sys.meta_path]


def _fail(code, message):
    sys.stdout.flush()
    sys.stderr.write(message.rstrip("\n") + "\n")
    sys.stderr.flush()
    os._exit(code)


def _candidate_traceback(err):
    """The traceback of `err` without the frames of this file."""
    tb = err.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(err), err, tb))


class _Base64Writer:
    """A binary file-like object that writes what it gets, base64-encoded, to a text file."""

    def __init__(self, out):
        self.out, self.rest = out, b""

    def write(self, data):
        data = self.rest + bytes(data)
        cut = len(data) - len(data) % 3  # base64 encodes whole groups of 3 bytes
        self.out.write(base64.b64encode(data[:cut]).decode("ascii"))
        self.rest = data[cut:]
        return len(data)

    def close(self):
        self.out.write(base64.b64encode(self.rest).decode("ascii"))


def _write_output(value):
    """{"npy": base64 of the .npy bytes of `value`} as the return value (harness.py's protocol: to
    the descriptor DISCOVER_OUTPUT_FD names, else output.json), then exit 0."""
    import numpy as np

    if hasattr(value, "toarray"):  # a scipy sparse matrix
        value = value.toarray()
    try:
        array = np.asarray(value)
    except Exception as err:
        _fail(EXIT_BAD_VALUE, f"magic_denoise returned a {type(value).__name__} that is not an array: {err}")
    if array.dtype.kind not in "biuf":
        _fail(EXIT_BAD_VALUE, f"magic_denoise returned a {type(value).__name__} of dtype {array.dtype}, not real numbers")
    fd = os.environ.get("DISCOVER_OUTPUT_FD")  # harness.py's descriptor for the value, when it has one
    with os.fdopen(int(fd), "w", encoding="ascii") if fd else open("output.json.part", "w", encoding="ascii") as out:
        out.write('{"npy": "')
        encoder = _Base64Writer(out)
        np.lib.format.write_array(encoder, array, allow_pickle=False)
        encoder.close()
        out.write('"}')
    if not fd:
        os.replace("output.json.part", "output.json")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def denoise(job):
    import numpy as np

    X = np.load(os.path.join(os.environ["DISCOVER_DATA"], job["train"]), allow_pickle=False)
    module = types.ModuleType("denoiser")
    module.__file__ = CANDIDATE_FILE
    sys.modules["denoiser"] = module
    source = job["candidate"]
    linecache.cache[CANDIDATE_FILE] = (len(source), None, source.splitlines(True), CANDIDATE_FILE)
    try:
        code = compile(source, CANDIDATE_FILE, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as err:  # ValueError: source with null bytes
        _fail(EXIT_RAISED, "".join(traceback.format_exception_only(type(err), err)))
    try:
        exec(code, module.__dict__)
        fn = module.__dict__.get(job["entry"])
        if not callable(fn):
            _fail(EXIT_NO_ENTRY, f"program defines no function `{job['entry']}`")
        value = fn(X, random_state=job["random_state"])
    except BaseException as err:  # SystemExit too: the candidate never returned a value
        _fail(EXIT_RAISED, _candidate_traceback(err))
    _write_output(value)
