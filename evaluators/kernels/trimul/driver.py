"""The timer: the trusted process that times and samples one TriMul candidate (docs/method.md §5c, the two-process clock).

Sent into the sandbox as source text after inputs.py and handover.py (never imported by the host);
the sandbox's harness calls `main(job)`. The candidate never runs here: it runs in the kernel
process (kernel_process.py), a fresh interpreter this process starts, and everything that process
says is untrusted. Whatever runs in the candidate's process can reach whatever that process holds,
so the clock, the inputs' seeds, the output's judge and the report live where it cannot reach:

1. Before the kernel process exists: every module this process needs is imported, then it makes
   itself non-dumpable (prctl PR_SET_DUMPABLE 0: a process of the same user can neither ptrace it
   nor read its memory, its file descriptors or its environment through /proc) and a child
   subreaper (PR_SET_CHILD_SUBREAPER: whatever the kernel process starts stays its descendant,
   so it can kill all of it before its report is written).
2. Every call gets fresh inputs, generated here from a seed drawn from the OS after the previous
   call, into buffers the kernel process cannot see until they are handed over: on CPU new memfd
   buffers passed over the socket (SCM_RIGHTS), on a GPU new CUDA allocations passed as CUDA IPC
   handles. The output buffer is new too, filled with NaN.
3. The clock starts, the buffers are handed over, the kernel process replies; this process then
   copies the output buffer into its own memory (on a GPU: a device copy on its own stream and a
   synchronise) and only then stops the clock. A reply sent before the output was written gives a
   copy with the unwritten NaNs (the checker rejects it) or, where the copy had to wait for the
   kernel's work, a time that includes the work. What is subtracted is never measured through the
   candidate's process (issue 27: a kernel that made those calls slow had up to 790x "gained"):
   before the candidate's process exists, a calibration process of the same kind (the same program,
   interpreter, handover and output copy) loads a trusted kernel that returns its input x, and the
   fastest of its round trips per benchmark shape (after warm-up calls) is the overhead subtracted:
   the least the harness's own part of a call took, so noise in the calibration (a loaded machine)
   can only lengthen the candidate's time, never credit it with overhead it did not pay.
   The candidate's process sees only real calls, each timed and each checked, so it has no call to
   behave differently on; the warm-up call is never timed.
4. After each call: the inputs compared bit for bit with the private copy kept here (in-place
   writes), the copied output sampled at positions drawn after the copy, and the previous call's
   output buffer compared with its copy (a write after the reply: the kernel replied before it
   was done). The samples go to the checker, another process that computes the reference.
5. On a GPU, per benchmark shape: a warm-up call, then timed calls, each after an L2 flush, until
   MAX_CALLS, a standard error of the mean under 0.1% of it, or the shape's time budget (as the
   competition's harness does). On CPU the same loop times the benchmark shapes the job names
   (the CPU check's timing, which tests compare between kernels).
6. At the end the kernel process and every process it started are killed before the report is
   returned, so nothing the candidate started can write the run's output file afterwards.

The GPU half (CUDA IPC handover, device copy) follows the same protocol as the CPU half but has
not been run on a GPU by the tests of this repository's CPU machines.
"""

import base64
import ctypes
import mmap
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
import traceback

KERNEL_DIR = "kernel"  # the kernel process's working directory, inside the run's directory
CALIBRATION_DIR = "calibration"  # the calibration process's working directory, inside the run's directory
CALIBRATION_WARMUP = 3  # untimed calls per benchmark shape before the calibration's timed ones
CALIBRATION_CALLS = 21  # the calibration's timed round trips per benchmark shape; the fastest is subtracted
# The trusted kernel of the calibration: no work, the output copy and everything around it as in a real call.
CALIBRATION_KERNEL = "def custom_kernel(data):\n    return data[0]\n"
PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER = 4, 36


def _b64(array):
    return base64.b64encode(array.astype("<f4").tobytes()).decode("ascii")


class Rejected(Exception):
    """A rule the candidate broke while it ran; the message is its reason."""


class KernelFailed(Exception):
    """The candidate raised, failed to import, or its process died; the message is its reason."""


def become_untouchable():
    """docs/method.md §5c: the timer's memory out of the kernel process's reach, and its descendants ours to kill."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0 or libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl failed: the timer cannot protect itself from the kernel process")


def _children(pid):
    """Pids of the live children of `pid` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == pid:
            found.append(int(entry))
    return found


def kill_descendants():
    """Kill every process this one started and whatever they started (adopted here: we are a subreaper)."""
    me = os.getpid()
    for _ in range(1000):
        children = _children(me)
        if not children:
            return True
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in children:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
    return False


class KernelLink:
    """The kernel process and the socket to it."""

    def __init__(self, job, workdir, program, source=None, directory=KERNEL_DIR):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        kernel_dir = os.path.join(workdir, directory)
        os.makedirs(kernel_dir, exist_ok=True)
        # Import-path entries kept open as /proc/self/fd/N by the harness must stay open in the child.
        path_fds = [int(p.split("/")[-1]) for p in sys.path if p.startswith("/proc/self/fd/") and p.split("/")[-1].isdigit()]
        # /proc/self/exe: this interpreter, even where its directory is closed to the sandbox's uid; its
        # standard library comes from the same (inherited) descriptors, through PYTHONPATH.
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        self.proc = subprocess.Popen(
            ["/proc/self/exe", "-S", "-s", "-B", "-c", program, str(theirs.fileno())],
            pass_fds=[theirs.fileno(), *path_fds],
            cwd=kernel_dir,
            env=env,
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        self.sock = ours
        self.next_id = 0
        # No candidate code exists yet: it arrives with "load", after this process has closed itself off.
        become_untouchable()
        self.load_reply = self.request(
            {
                "op": "load",
                "source": job["source"] if source is None else source,
                "sys_path": list(sys.path),
                "workdir": kernel_dir,
                "device": job["device"],
            }
        )

    def request(self, message, fds=()):
        """Send one message and return the reply; a dead kernel process or a broken protocol raises KernelFailed."""
        try:
            send_message(self.sock, message, fds)  # noqa: F821 (handover.py precedes this text)
            reply, got = receive_message(self.sock)  # noqa: F821
        except (ProtocolError, OSError) as err:  # noqa: F821
            code = self.proc.poll()
            raise KernelFailed(
                f"the kernel process {'exited with code ' + str(code) if code is not None else 'broke the protocol'} ({err})"
            ) from None
        for fd in got:  # nothing the kernel process sends is used; descriptors included
            os.close(fd)
        return reply

    def call(self, message, fds=()):
        self.next_id += 1
        reply = self.request({**message, "op": "call", "id": self.next_id}, fds)
        if reply.get("id") != self.next_id:
            raise KernelFailed(
                f"the kernel process answered call {reply.get('id')!r} when call {self.next_id} was due "
                "(a reply out of turn: the protocol is broken)"
            )
        return reply

    def close(self):
        try:
            send_message(self.sock, {"op": "exit"})  # noqa: F821
            self.proc.wait(timeout=2)
        except Exception:  # noqa: BLE001  (it is killed below either way)
            pass
        self.sock.close()
        return kill_descendants()


class CpuHandover:
    """One call's buffers on CPU: inputs and output in memfd memory the kernel process sees only once handed over."""

    def __init__(self, torch, numpy, data, out_shape):
        x, mask, weights, config = data
        self.np = numpy
        self.tensors = {"x": x, "mask": mask, **{"w:" + k: v for k, v in weights.items()}}
        self.layout, offset = [], 0
        for name, t in self.tensors.items():
            self.layout.append(
                {"name": name, "dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape), "offset": offset, "buffer": 0}
            )
            offset += (t.numel() * t.element_size() + 63) // 64 * 64
        self.in_fd, self.inputs = self._buffer("trimul-inputs", max(offset, 64))
        self.private = {}
        for entry, (name, t) in zip(self.layout, self.tensors.items()):
            raw = t.contiguous().numpy().tobytes()
            self.inputs[entry["offset"] : entry["offset"] + len(raw)] = raw
            self.private[name] = (entry["offset"], raw)
        count = 1
        for d in out_shape:
            count *= d
        self.out_shape = tuple(out_shape)
        self.out_fd, self.output = self._buffer("trimul-output", count * 4)
        self.output[:] = numpy.full(count, numpy.nan, dtype="<f4").tobytes()
        self.layout.append({"name": "out", "dtype": "float32", "shape": list(out_shape), "offset": 0, "buffer": 1})
        self.torch = torch
        self.copy = None

    @staticmethod
    def _buffer(name, size):
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
        os.ftruncate(fd, size)
        return fd, mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)

    def message(self):
        return {"layout": self.layout}

    def fds(self):
        return (self.in_fd, self.out_fd)

    def handed_over(self):
        for fd in (self.in_fd, self.out_fd):
            os.close(fd)

    def take_output(self):
        """This process's own copy of the output buffer, made as soon as the reply came."""
        self.copy = bytes(self.output)

    def output_tensor(self):
        return self.torch.frombuffer(bytearray(self.copy), dtype=self.torch.float32).view(self.out_shape)

    def shared_x(self):
        entry = self.layout[0]
        return self.torch.frombuffer(
            self.inputs, dtype=self.torch.float32, count=len(self.private["x"][1]) // 4, offset=entry["offset"]
        ).view(entry["shape"])

    def mutated(self):
        for name, (offset, raw) in self.private.items():
            if self.inputs[offset : offset + len(raw)] != raw:
                return name.removeprefix("w:")
        return ""

    def written_late(self):
        return self.copy is not None and bytes(self.output) != self.copy

    def release(self):
        self.inputs.close()
        self.output.close()


class CudaHandover:
    """One call's buffers on a GPU: fresh CUDA allocations handed over as CUDA IPC handles (never run here)."""

    def __init__(self, torch, numpy, data, out_shape):
        from torch.multiprocessing.reductions import reduce_tensor

        x, mask, weights, config = data
        self.torch = torch
        self.tensors = {"x": x, "mask": mask, **{"w:" + k: v for k, v in weights.items()}}
        self.private = {name: t.clone() for name, t in self.tensors.items()}
        self.out = torch.full(tuple(out_shape), float("nan"), dtype=torch.float32, device="cuda")
        torch.cuda.synchronize()
        shared = {**self.tensors, "out": self.out}
        self.handles = base64.b64encode(pickle.dumps({n: reduce_tensor(t) for n, t in shared.items()})).decode("ascii")
        self.copy = None

    def message(self):
        return {"handles": self.handles}

    def fds(self):
        return ()

    def handed_over(self):
        pass

    def take_output(self):
        """A device copy on this process's stream, then a synchronise: it reads what is there now."""
        self.copy = self.out.clone()
        self.torch.cuda.synchronize()

    def output_tensor(self):
        return self.copy

    def shared_x(self):
        return self.tensors["x"]

    def mutated(self):
        for name, before in self.private.items():
            now = self.tensors[name]
            bits = (lambda t: t.view(self.torch.int32)) if now.dtype == self.torch.float32 else (lambda t: t)
            if not self.torch.equal(bits(now), bits(before)):
                return name.removeprefix("w:")
        return ""

    def written_late(self):
        self.torch.cuda.synchronize()
        return self.copy is not None and not self.torch.equal(self.out.view(self.torch.int32), self.copy.view(self.torch.int32))

    def release(self):
        self.tensors = self.private = self.out = self.copy = None


class Timer:
    def __init__(self, job, torch, numpy, inputs, link):
        self.job, self.torch, self.np, self.generate, self.link = job, torch, numpy, inputs, link
        self.device = job["device"]
        self.calls = []
        self.pending = None  # the previous call's buffers: checked for writes after its reply
        self.Handover = CudaHandover if self.device == "cuda" else CpuHandover
        if self.device == "cuda":
            l2 = int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or 0)
            self.flush_buffer = torch.empty(max(2 * l2, 256 << 20) // 4, dtype=torch.float32, device="cuda")
            self.sync = torch.cuda.synchronize
        else:
            self.flush_buffer = None
            self.sync = lambda: None

    def fresh_seed(self):
        return int.from_bytes(os.urandom(6), "little")

    def handover(self, shape, seed):
        data = self.generate(**{**shape, "seed": seed}, device=self.device)
        out_shape = (shape["bs"], shape["seqlen"], shape["seqlen"], shape["dim"])
        return self.Handover(self.torch, self.np, data, out_shape), data[3]

    def round_trip(self, hand, config, timed):
        """(ms from handing the buffers over to holding a copy of the output, the reply)."""
        if timed and self.flush_buffer is not None:
            self.flush_buffer.zero_()  # evict L2: the inputs come from memory, as in real use
        self.sync()
        t0 = time.perf_counter_ns()
        try:
            reply = self.link.call({**hand.message(), "config": config}, hand.fds())
        finally:
            hand.handed_over()
        hand.take_output()  # docs/method.md §5c, the two-process clock: it stops once the output is ours
        ms = (time.perf_counter_ns() - t0) / 1e6
        return ms, reply

    def check_late_writes(self):
        if self.pending is not None:
            hand, label = self.pending
            self.pending = None
            late = hand.written_late()
            hand.release()
            if late:
                raise Rejected(
                    f"{label}: the output buffer changed after the kernel process replied (it replied before "
                    "its work was done; the time would have missed it)"
                )

    def call(self, where, shape, seed, kind, timed=False, overhead_ms=0.0):
        """One call on fresh inputs (a fresh seed when `seed` is None); returns its record, or raises."""
        set_name, shape_index = where
        seed = self.fresh_seed() if seed is None else int(seed)
        label = f"{kind} call on {set_name} shape {shape_index}"
        hand, config = self.handover(shape, seed)
        host_ms, reply = self.round_trip(hand, config, timed=timed)
        if reply.get("rejected"):
            raise Rejected(f"{label}: {reply['rejected']}")
        if reply.get("error"):
            raise KernelFailed(str(reply["error"])[:600])
        if reply.get("done") is not True:
            raise KernelFailed(f"{label}: the kernel process sent a reply that is neither done nor an error")
        self.check_late_writes()
        changed = hand.mutated()
        if changed:
            raise Rejected(f"{label}: it mutated its input `{changed}` in place (inputs must be left as they were given)")
        pos_seed, full, values, x_values = self.sample(hand.output_tensor(), hand.shared_x(), kind in ("test", "check"))
        self.pending = (hand, label)
        ms = host_ms - overhead_ms if timed else None
        if timed and ms <= 0:
            raise Rejected(
                f"{label}: the kernel process answered in {host_ms:.4f} ms, no slower than the calibration's "
                f"trusted kernel that returns its input ({overhead_ms:.4f} ms): it replied without running the kernel"
            )
        record = {
            "kind": kind,
            "set": set_name,
            "shape": shape_index,
            "seed": seed,
            "pos_seed": pos_seed,
            "full": full,
            "values": values,
            "x_values": x_values,
            "ms": ms,
            "host_ms": host_ms,
        }
        self.calls.append(record)
        return record

    def sample(self, out, x, test):
        """(pos_seed, full, values, x_values): positions drawn now, after the output was copied."""
        torch, np = self.torch, self.np
        pos_seed = self.fresh_seed()
        rng = np.random.default_rng(pos_seed)
        numel = out.numel()
        full = numel <= self.job["full_check_elements"]
        with torch.no_grad():
            if full:
                values = out.reshape(-1).cpu().numpy()
            else:
                flat = rng.integers(0, numel, self.job["sample_elements"]["test" if test else "timed"])
                idx = [torch.as_tensor(a, device=out.device) for a in np.unravel_index(flat, tuple(out.shape))]
                values = out[tuple(idx)].cpu().numpy()
            x_flat = rng.integers(0, x.numel(), self.job["x_sample_elements"])
            x_idx = [torch.as_tensor(a, device=x.device) for a in np.unravel_index(x_flat, tuple(x.shape))]
            x_values = x[tuple(x_idx)].cpu().numpy()
        return pos_seed, full, _b64(values), _b64(x_values)

    def calibrate(self, shapes):
        """Per shape, the fastest round trip of the trusted calibration kernel (it returns its input):
        the handover, mapping, output copy and reply of a real call, with no work. Run while the
        timer's link is to the calibration process, before the candidate's process exists."""
        overheads = []
        for shape in shapes:
            trips = []
            for i in range(CALIBRATION_WARMUP + CALIBRATION_CALLS):
                hand, config = self.handover(shape, self.fresh_seed())
                ms, reply = self.round_trip(hand, config, timed=True)
                hand.release()
                if reply.get("done") is not True:
                    raise RuntimeError(f"the calibration kernel (trusted, no candidate code) failed: {str(reply)[:300]}")
                if i >= CALIBRATION_WARMUP:
                    trips.append(ms)
            overheads.append(min(trips))  # the least overhead a call can have: noise never pays the candidate
        return overheads

    def benchmark(self, index, shape, overhead):
        """Warm-up, then timed calls; `overhead`: the calibration's round trip on this shape, in ms."""
        t = self.job["timing"]
        where = ("benchmarks", index)
        self.call(where, shape, shape["seed"], "warmup")
        self.check_late_writes()
        times = []
        started = time.monotonic()
        while len(times) < t["max_calls"]:
            rec = self.call(where, shape, None, "timed", timed=True, overhead_ms=overhead)
            times.append(rec["ms"])
            n = len(times)
            if n >= t["min_calls"]:
                mean = sum(times) / n
                std = (sum((v - mean) ** 2 for v in times) / (n - 1)) ** 0.5
                if (
                    std / n**0.5 < t["rel_err"] * abs(mean)
                    or sum(times) > 1e3 * t["kernel_budget_s"]
                    or time.monotonic() - started > t["wall_budget_s"]
                ):
                    break
        self.check_late_writes()
        n = len(times)
        mean = sum(times) / n
        std = (sum((v - mean) ** 2 for v in times) / (n - 1)) ** 0.5 if n > 1 else 0.0
        return {
            "shape": index,
            "calls": n,
            "mean_ms": mean,
            "std_ms": std,
            "best_ms": min(times),
            "worst_ms": max(times),
            "calibration_round_trip_ms": overhead,
        }


def _error(prefix, err):
    tb = "".join(traceback.format_exception(type(err), err, err.__traceback__)[-6:])
    print(tb, file=sys.stderr, flush=True)
    lines = [line for line in tb.strip().splitlines() if line.strip()]
    return {"error": f"{prefix}: {lines[-1][:400] if lines else type(err).__name__}"}


def main(job):
    workdir = os.getcwd()
    os.environ.update(
        {
            "TRITON_CACHE_DIR": os.path.join(workdir, "triton-cache"),  # fresh per candidate: nothing reused
            "TRITON_HOME": workdir,
            "TORCHINDUCTOR_CACHE_DIR": os.path.join(workdir, "inductor-cache"),
            "TORCHINDUCTOR_FX_GRAPH_CACHE": "0",
            "TORCHINDUCTOR_AUTOGRAD_CACHE": "0",
            "TORCHINDUCTOR_COMPILE_THREADS": "1",
            # getpass.getuser() reads these before the password database, where the sandbox's uid has
            # no entry (torch.compile's import asked for it and failed: "getpwuid(): uid not found")
            # (Inductor's precompiled headers go to $TMPDIR/torchinductor_$USER: the run's own directory).
            "USER": "sandbox",
            "LOGNAME": "sandbox",
            "TORCH_COMPILE_DEBUG_DIR": os.path.join(workdir, "compile-debug"),  # Inductor's debug output, if any
            "TMPDIR": workdir,  # already so in both sandboxes; said here because Inductor's headers follow it
            "CUDA_CACHE_DISABLE": "1",
        }
    )
    if job["device"] == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # Triton's interpreter runs the kernels on CPU tensors
    from importlib.metadata import version

    import numpy
    import torch

    report = {
        "versions": {"torch": torch.__version__, "triton": version("triton"), "python": sys.version.split()[0]},
        "triton_cache_dir": os.environ["TRITON_CACHE_DIR"],
        "calls": [],
        "benchmarks": [],
    }
    if job["device"] == "cuda":
        if not torch.cuda.is_available():
            return {**report, "error": "no CUDA device is visible inside the sandbox (is the GPU device request working?)"}
        import torch.multiprocessing.reductions  # noqa: F401  (imported before the timer closes itself off)

        props = torch.cuda.get_device_properties(0)
        report["gpu"] = {
            "name": props.name,
            "memory_bytes": int(props.total_memory),
            "sm_count": int(props.multi_processor_count),
            "capability": f"{props.major}.{props.minor}",
        }
        declared = job.get("gpu_type")
        if declared and declared.lower() not in props.name.lower():
            return {**report, "wrong_gpu": True, "error": f"the GPU is {props.name}, but the pool declares {declared}; nothing was timed"}
    numpy.random.default_rng(0).integers(0, 2, 2)  # load what sampling needs before closing off
    result = run_kernel(job, report, torch, numpy, workdir)
    if not kill_descendants():
        return {**report, "calls": [], "error": "processes the kernel started could not all be killed; nothing it reported is used"}
    return result


def calibrate(job, report, torch, numpy, workdir):
    """The overhead subtracted per benchmark shape, measured before the candidate's process exists
    (docs/method.md §5c, the calibration): a fresh kernel process of the same kind, the same program
    and handover, loading the trusted CALIBRATION_KERNEL; it is killed before the candidate starts."""
    if not job["benchmarks"]:
        return []
    link = KernelLink(job, workdir, job["kernel_program"], source=CALIBRATION_KERNEL, directory=CALIBRATION_DIR)
    try:
        if link.load_reply.get("ok") is not True:
            raise RuntimeError(f"the calibration kernel (trusted, no candidate code) did not load: {str(link.load_reply)[:300]}")
        overheads = Timer(job, torch, numpy, generate_input, link).calibrate(job["benchmarks"])  # noqa: F821 (inputs.py)
    finally:
        if not link.close():
            raise RuntimeError("the calibration process's descendants could not all be killed")
    report["calibration"] = {"kernel": CALIBRATION_KERNEL, "calls": CALIBRATION_CALLS, "round_trip_ms": overheads}
    return overheads


def run_kernel(job, report, torch, numpy, workdir):
    """The kernel process started, loaded, called on every test and benchmark shape, and closed: the report."""
    link = None
    try:
        overheads = calibrate(job, report, torch, numpy, workdir)
        link = KernelLink(job, workdir, job["kernel_program"])  # becomes untouchable once the process exists
        reply = link.load_reply
        if reply.get("error"):
            return {**report, "error": str(reply["error"])[:600]}
        if reply.get("rejected"):
            return {**report, "rejected": str(reply["rejected"])[:600]}
        if reply.get("ok") is not True:
            return {**report, "error": "the kernel process did not confirm that the kernel loaded"}
        timer = Timer(job, torch, numpy, generate_input, link)  # noqa: F821  (inputs.py precedes this text)
        report["calls"] = timer.calls
        for i, shape in enumerate(job["tests"]):
            for j, seed in enumerate(job["test_seeds"][i]):  # None: a fresh seed (a repeat on new inputs)
                timer.call(("tests", i), shape, seed, "test" if j == 0 else "check")
        for i, shape in enumerate(job["benchmarks"]):
            report["benchmarks"].append(timer.benchmark(i, shape, overheads[i]))
        link.close()
        link = None
        timer.check_late_writes()  # the kernel process is gone: whatever it left in the last buffer is final
        return report
    except Rejected as err:
        return {**report, "rejected": str(err)}
    except KernelFailed as err:
        return {**report, "error": str(err)}
    except BaseException as err:  # noqa: BLE001
        return {**report, **_error("the timer failed", err)}
    finally:
        if link is not None:
            link.close()
