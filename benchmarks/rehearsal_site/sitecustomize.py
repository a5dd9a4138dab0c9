"""The GPU check's rehearsal on CPU (`make gpu-check REHEARSE=1`, benchmarks/gpu_rehearsal.py).

On the path of every process of a rehearsed part (PYTHONPATH) when GPU_CHECK_REHEARSAL_DIR is set:
torch answers that one CUDA device is there, so each part takes the branch it takes on the GPU
machine, and the first call that would initialise CUDA (`torch._C._cuda_init`, which every lazy
initialisation goes through, from Python or from C++) stops the process instead. Before it stops,
it writes `GPU_CHECK_REHEARSAL_DIR/<pid>.json`: where the call came from, how long the process had
run, and every module it had imported with the distribution that provided it; a process that ends
without reaching CUDA writes the same record at exit (reached: false). Without
GPU_CHECK_REHEARSAL_DIR this file does nothing.
"""

from __future__ import annotations

import os

if os.environ.get("GPU_CHECK_REHEARSAL_DIR"):
    import atexit
    import importlib.abc
    import importlib.machinery
    import json
    import sys
    import time
    import traceback

    REACHED_EXIT = 97  # the exit status of a process stopped at its first CUDA call
    _STARTED = time.perf_counter()
    _OUT = os.environ["GPU_CHECK_REHEARSAL_DIR"]
    _written = [False]

    def _modules() -> dict[str, str | None]:
        """Top-level modules imported so far -> the distribution that provides them (None: stdlib or the checkout)."""
        from importlib.metadata import packages_distributions

        dists = packages_distributions()
        tops = {name.split(".")[0] for name in list(sys.modules)}
        return {top: (dists.get(top) or [None])[0] for top in sorted(tops) if top not in sys.stdlib_module_names}

    def _record(reached: bool, where: list[str]) -> None:
        if _written[0]:
            return
        _written[0] = True
        record = {
            "pid": os.getpid(),
            "argv": sys.argv,
            "reached_cuda": reached,
            "where": where,
            "seconds": time.perf_counter() - _STARTED,
            "modules": _modules(),
        }
        path = os.path.join(_OUT, f"{os.getpid()}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(record, f, indent=1)
        os.replace(path + ".tmp", path)

    def _reached_cuda(*_args, **_kwargs):
        frames = [f for f in traceback.extract_stack()[:-1] if "/torch/" not in f.filename and "sitecustomize" not in f.filename]
        where = [f"{f.filename}:{f.lineno} in {f.name}: {(f.line or '').strip()}" for f in frames[-8:]]
        _record(True, where)
        print(f"[rehearsal] first CUDA call reached: {where[-1] if where else '?'}", file=sys.stderr, flush=True)
        os._exit(REACHED_EXIT)  # nothing may catch it: this is as far as a machine without a GPU can go

    def _patch_torch_cuda(module) -> None:
        module.is_available = lambda: True
        module.device_count = lambda: 1
        sys.modules["torch._C"]._cuda_init = _reached_cuda

    class _AfterTorchCuda(importlib.abc.MetaPathFinder):
        """Patches torch.cuda right after it is imported (torch itself is imported only if the part does)."""

        def find_spec(self, name, path=None, target=None):
            if name != "torch.cuda":
                return None
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is None or spec.loader is None:
                return spec
            exec_module = spec.loader.exec_module

            def exec_and_patch(module):
                exec_module(module)
                _patch_torch_cuda(module)

            spec.loader.exec_module = exec_and_patch
            return spec

    sys.meta_path.insert(0, _AfterTorchCuda())
    atexit.register(lambda: _record(False, []))
