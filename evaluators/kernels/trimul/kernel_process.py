"""The kernel process: runs one TriMul candidate, at the timer's bidding (docs/method.md §5c, the two-process clock).

Started by the timer (driver.py) as a fresh interpreter, `python -S -s -B -c <handover.py +
this text> FD`, FD its end of the socket pair. Everything here runs next to the candidate and is
untrusted: the candidate can rewrite any of it. Its checks (patched functions, evaluator modules,
new threads, torch modes, the output's type, dtype and shape) are there to give an honest kernel a
clear reason; nothing the timer measures or judges depends on them. What it does:

1. "load": the import path, the candidate's source written to submission.py and imported.
2. "call": the inputs mapped from the buffers the timer hands over only as its clock starts (file
   descriptors of memory on CPU, CUDA IPC handles on a GPU), `custom_kernel(data)` called, its
   output copied into the timer's output buffer, a synchronise, and a reply. Every call runs the
   kernel: the overhead the timer subtracts comes from another process of this program that loads a
   trusted kernel (driver.py, the calibration), never from this one.
3. "exit".
"""

import base64
import mmap
import os
import sys
import threading
import time
import traceback

ENTRY = "custom_kernel"
HARNESS_PACKAGES = ("evaluators", "discover", "flows", "storage", "cli", "candidate")
DTYPES = {"float32": "float32", "int64": "int64"}


class Captured:
    """What the kernel process relies on, taken before the candidate exists, and a check that none changed."""

    def __init__(self, torch):
        self.torch = torch
        watched = {
            "time.perf_counter": (time, "perf_counter"),
            "time.perf_counter_ns": (time, "perf_counter_ns"),
            "time.time": (time, "time"),
            "os.urandom": (os, "urandom"),
            "threading.enumerate": (threading, "enumerate"),
            "torch.Tensor": (torch, "Tensor"),
            "torch.empty": (torch, "empty"),
            "torch.equal": (torch, "equal"),
            "torch.frombuffer": (torch, "frombuffer"),
            "torch.cuda.synchronize": (torch.cuda, "synchronize"),
            "torch.cuda.Event": (torch.cuda, "Event"),
            "torch.cuda.current_stream": (torch.cuda, "current_stream"),
        }
        for method in ("copy_", "view", "reshape", "contiguous", "to"):
            watched[f"torch.Tensor.{method}"] = (torch.Tensor, method)
        self.watched = watched
        self.snapshot = {name: getattr(owner, attr) for name, (owner, attr) in watched.items()}
        self.threads = {t.ident for t in threading.enumerate()}
        self.enumerate_threads = threading.enumerate
        self.modes = (getattr(torch._C, "_len_torch_function_stack", None), getattr(torch._C, "_len_torch_dispatch_stack", None))

    def violation(self):
        """Why the process is no longer the one set up, or ""."""
        for name, (owner, attr) in self.watched.items():
            if getattr(owner, attr, None) is not self.snapshot[name]:
                return f"it replaced {name} (patching the clock, the events or tensors is not allowed)"
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in HARNESS_PACKAGES)
        if loaded:
            return f"it imported {loaded[0]}, a module of the evaluator (the reference and the harness are off limits)"
        for count in self.modes:
            if count is not None and count() != 0:
                return "a torch function or dispatch mode is active after the call (lazy evaluation is not allowed)"
        new = [t.name for t in self.enumerate_threads() if t.ident not in self.threads and t.is_alive()]
        if new:
            return f"it started a thread ({new[0]}); work on other threads escapes the timing and is not allowed"
        return ""


def validate_output(torch, out, expected, device):
    if type(out) is not torch.Tensor:
        return (
            f"it returned a {type(out).__module__}.{type(out).__qualname__}, not a "
            "plain torch.Tensor (tensor subclasses and lazy tensors are rejected)"
        )
    if out.layout != torch.strided or out.is_meta:
        return (
            f"it returned a tensor with layout {out.layout}{' on meta' if out.is_meta else ''}; "
            "a strided tensor with its values is required"
        )
    if out.device.type != device:
        return f"it returned a tensor on {out.device}; the output must be on {device}"
    if out.dtype != torch.float32:
        return f"it returned dtype {str(out.dtype).replace('torch.', '')}; float32 is required"
    if tuple(out.shape) != tuple(expected):
        return f"it returned shape {list(out.shape)}; expected {list(expected)}"
    return ""


class KernelProcess:
    def __init__(self, sock):
        self.sock = sock
        self.torch = None
        self.fn = None
        self.captured = None
        self.device = "cpu"

    def load(self, message):
        sys.path[:] = list(message["sys_path"])
        os.chdir(message["workdir"])
        self.device = message["device"]
        import importlib.util

        import torch

        quiet_progress_bars()
        self.torch = torch
        self.captured = Captured(torch)
        path = os.path.join(message["workdir"], "submission.py")
        with open(path, "w", encoding="utf-8") as f:
            f.write(message["source"])
        try:
            spec = importlib.util.spec_from_file_location("submission", path)
            module = importlib.util.module_from_spec(spec)
            sys.modules["submission"] = module
            spec.loader.exec_module(module)
        except BaseException as err:  # noqa: BLE001  (SystemExit too: the module never finished loading)
            return {"error": "the kernel failed to import: " + _last_line(err)}
        self.fn = getattr(module, ENTRY, None)
        if not callable(self.fn):
            return {"error": f"the kernel defines no function `{ENTRY}(data)`"}
        why = self.captured.violation()
        return {"rejected": f"at import: {why}"} if why else {"ok": True}

    def tensors_cpu(self, layout, fds):
        """Tensors over the shared buffers: the inputs' memory and the output's, mapped from their descriptors."""
        torch = self.torch
        maps = []
        for fd in fds:
            size = os.fstat(fd).st_size
            maps.append(mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE))
            os.close(fd)
        views = {}
        for entry in layout:
            dtype = getattr(torch, DTYPES[entry["dtype"]])
            count = 1
            for d in entry["shape"]:
                count *= d
            views[entry["name"]] = torch.frombuffer(maps[entry["buffer"]], dtype=dtype, count=count, offset=entry["offset"]).view(
                entry["shape"]
            )
        return views

    def tensors_cuda(self, handles):
        """Tensors over the timer's CUDA memory, from the IPC handles it sent (trusted data from the timer)."""
        import pickle

        return {name: rebuild(*args) for name, (rebuild, args) in pickle.loads(base64.b64decode(handles)).items()}

    def call(self, message, fds):
        torch = self.torch
        views = self.tensors_cpu(message["layout"], fds) if self.device == "cpu" else self.tensors_cuda(message["handles"])
        out = views.pop("out")
        weights = {k[len("w:") :]: v for k, v in views.items() if k.startswith("w:")}
        data = (views["x"], views["mask"], weights, dict(message["config"]))
        result = self.fn(data)
        why = self.captured.violation() or validate_output(torch, result, out.shape, self.device)
        if why:
            return {"id": message["id"], "rejected": why}
        with torch.no_grad():
            out.copy_(result)
        self.sync()
        return {"id": message["id"], "done": True}

    def sync(self):
        if self.device == "cuda":
            self.torch.cuda.synchronize()

    def serve(self):
        while True:
            message, fds = receive_message(self.sock)  # noqa: F821 (handover.py precedes this text)
            op = message.get("op")
            if op == "exit":
                return
            try:
                reply = self.load(message) if op == "load" else self.call(message, fds)
            except BaseException as err:  # noqa: BLE001
                traceback.print_exc()
                reply = {"id": message.get("id"), "error": "the kernel raised: " + _last_line(err)}
            send_message(self.sock, reply)  # noqa: F821 (handover.py)


def quiet_progress_bars():
    """No tqdm monitor thread: torch.compile makes a (disabled) tqdm bar per compilation, and every
    tqdm instance starts a monitor thread, which the thread check above would reject as the kernel's."""
    try:
        import tqdm
    except ImportError:  # torch then uses its own stand-in, which starts no thread
        return
    tqdm.tqdm.monitor_interval = 0


def _last_line(err):
    lines = [line for line in "".join(traceback.format_exception_only(type(err), err)).strip().splitlines() if line.strip()]
    return (lines[-1] if lines else type(err).__name__)[:400]


if __name__ == "__main__":
    import socket

    KernelProcess(socket.socket(fileno=int(sys.argv[1]))).serve()
    sys.stdout.flush()
    os._exit(0)
