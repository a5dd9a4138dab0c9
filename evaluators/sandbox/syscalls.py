"""The system calls each kind of candidate may make: seccomp allow-lists, default deny.

One profile per kind of sandboxed process (`PROFILES`):
- "python": a Python run of the math and single-cell problems (NumPy, SciPy, scanpy and friends);
- "gpu": a Python run of a GPU problem (TriMul: PyTorch, Triton, torch.compile, which also runs
  the C compiler and assembler under the same filter);
- "compiler": the C++ compiler of a compiled program (g++, cc1plus, as, ld);
- "program": one case of a compiled program (AtCoder C++).
Each list is what the honest seeds and the published programs of the domains that use it were
seen to call, derived by `python -m evaluators.learn_profiles` (which runs them in the
sandbox with a filter that lets every call through and writes each one down), plus LAUNCHER (what
confine.py calls after its filter is on). A few calls are allowed only with some arguments
(`_conditions`): clone without namespace flags, socket of the local and internet families only
(the network namespace has a loopback and nothing else), personality as a query only; clone3 answers
ENOSYS (its flags are in memory, out of a filter's sight; the C library then falls back to clone).

Everything else is denied: with a listener (bubblewrap) the host answers EPERM and names the call in
the verdict (evaluators/sandbox/supervisor.py); without one (gVisor, Docker) the kernel answers EPERM
by itself. A system call of another architecture (32-bit calls on a 64-bit kernel) kills the process.
"""

from __future__ import annotations

import errno
import functools
import tempfile

from evaluators.sandbox.syscall_lists import COMPILER, GPU_EXTRA, LAUNCHER, PROGRAM, PYTHON

PROFILES: dict[str, frozenset[str]] = {
    "python": frozenset(PYTHON) | frozenset(LAUNCHER),
    "gpu": frozenset(PYTHON) | frozenset(GPU_EXTRA) | frozenset(COMPILER) | frozenset(LAUNCHER),
    "compiler": frozenset(COMPILER) | frozenset(LAUNCHER),
    "program": frozenset(PROGRAM) | frozenset(LAUNCHER),
}
MODES = ("notify", "errno", "learn")  # denied calls go to the host / fail with EPERM / all are let through and written down
NAMESPACE_FLAGS = 0x00020000 | 0x04000000 | 0x08000000 | 0x20000000 | 0x40000000 | 0x10000000 | 0x02000000 | 0x00000080
SOCKET_FAMILIES = (1, 2, 10)  # AF_UNIX, AF_INET, AF_INET6
PERSONALITY_QUERY = 0xFFFFFFFF
# The calls allowed with some arguments only (module docstring), one rule a row: (call, errno to
# answer or None to allow, (operator, first argument's value, mask or 0) or None); the libseccomp
# filter (`bpf`) and Docker's profile (`docker_profile`) are both built from it.
CONDITIONS: tuple[tuple[str, int | None, tuple[str, int, int] | None], ...] = (
    ("clone", None, ("MASKED_EQ", NAMESPACE_FLAGS, 0)),
    ("clone3", errno.ENOSYS, None),
    *(("socket", None, ("EQ", family, 0)) for family in SOCKET_FAMILIES),
    ("personality", None, ("EQ", PERSONALITY_QUERY, 0)),
)
CONDITIONAL = tuple(sorted({row[0] for row in CONDITIONS}))


def _conditions(seccomp, f, allow: int) -> None:
    """CONDITIONS as libseccomp rules of filter `f`."""
    for call, answer, cmp in CONDITIONS:
        args = [] if cmp is None else [seccomp.Arg(0, getattr(seccomp, cmp[0]), cmp[1], cmp[2])]
        f.add_rule(allow if answer is None else seccomp.ERRNO(answer), call, *args)


@functools.cache
def bpf(kind: str, mode: str = "notify") -> bytes:
    """The filter of profile `kind` as raw BPF (8 bytes an instruction), built by libseccomp.

    mode "notify": a call outside the profile goes to the listener (the host answers EPERM);
    "errno": it fails with EPERM; "learn": every call but LAUNCHER's goes to the listener, which
    lets it run (learn_profiles.py)."""
    import pyseccomp as seccomp

    if kind not in PROFILES:
        raise ValueError(f"unknown seccomp profile {kind!r}; the profiles are {', '.join(PROFILES)}")
    if mode not in MODES:
        raise ValueError(f"unknown seccomp mode {mode!r}; choose one of {', '.join(MODES)}")
    default = seccomp.ERRNO(errno.EPERM) if mode == "errno" else seccomp.NOTIFY
    f = seccomp.SyscallFilter(defaction=default)
    f.set_attr(seccomp.Attr.ACT_BADARCH, seccomp.KILL_PROCESS)
    allowed = frozenset(LAUNCHER) if mode == "learn" else PROFILES[kind]
    for name in sorted(allowed - set(CONDITIONAL)):
        try:
            f.add_rule(seccomp.ALLOW, name)
        except (RuntimeError, ValueError, OSError):
            continue  # not a system call of this architecture
    if mode != "learn":
        _conditions(seccomp, f, seccomp.ALLOW)
    with tempfile.TemporaryFile() as out:
        f.export_bpf(out)
        out.seek(0)
        return out.read()


@functools.lru_cache(maxsize=1024)
def name(arch: int, nr: int) -> str:
    """The name of system call `nr` of audit architecture `arch` ("syscall 999" when unknown)."""
    import pyseccomp as seccomp

    try:
        resolved = seccomp.resolve_syscall(arch, nr)
        return resolved.decode() if isinstance(resolved, bytes) else str(resolved)
    except (RuntimeError, ValueError, OSError):
        return f"syscall {nr}"


def describe(counts: dict[tuple[int, int], int], kind: str, flooded: bool = False) -> str:
    """One phrase for the verdict: "system calls outside the sandbox's python profile were denied:
    keyctl (2x), bpf"; "" when none was. `counts` holds at most DISTINCT_MAX numbers (the listener's
    bound), with (-1, -1) for the calls of all other numbers; `flooded`: the run was stopped for them."""
    if not counts:
        return ""
    from evaluators.sandbox.supervisor import OTHER, REFUSED_MAX

    other = counts.get(OTHER, 0)
    named = sorted(((name(arch, nr), n) for (arch, nr), n in counts.items() if (arch, nr) != OTHER), key=lambda item: (-item[1], item[0]))
    listed = ", ".join(f"{call} ({n}x)" if n > 1 else call for call, n in named)
    if other:
        listed += f", and {other} calls of other numbers"
    if flooded:
        return f"stopped after more than {REFUSED_MAX} system calls outside the sandbox's {kind} profile, each refused (EPERM): {listed}"
    return f"system calls outside the sandbox's {kind} profile were denied (EPERM): {listed}"


# Docker's names of the architectures (its profile lists the native one only: another's calls are killed)
DOCKER_ARCH = {"x86_64": "SCMP_ARCH_X86_64", "aarch64": "SCMP_ARCH_AARCH64"}


@functools.cache
def docker_profile(kinds: tuple[str, ...]) -> str:
    """A Docker seccomp profile (JSON, for `security_opt`): the union of `kinds`' allow-lists and what
    the container's own init, keeper and runner call (CONTAINER_RUNNER), the same argument
    conditions, and EPERM for everything else. Docker has no listener: a refused call is not named."""
    import json
    import platform

    from evaluators.sandbox.syscall_lists import CONTAINER_RUNNER

    allowed: set[str] = set(CONTAINER_RUNNER)
    for kind in kinds:
        allowed |= PROFILES[kind]
    arch = DOCKER_ARCH.get(platform.machine())
    rules: list[dict] = [{"names": sorted(allowed - set(CONDITIONAL)), "action": "SCMP_ACT_ALLOW"}]
    for call, answer, cmp in CONDITIONS:
        rule: dict = {"names": [call], "action": "SCMP_ACT_ALLOW" if answer is None else "SCMP_ACT_ERRNO"}
        if answer is not None:
            rule["errnoRet"] = answer
        if cmp is not None:
            rule["args"] = [{"index": 0, "value": cmp[1], "valueTwo": cmp[2], "op": f"SCMP_CMP_{cmp[0]}"}]
        rules.append(rule)
    profile = {"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": errno.EPERM, "syscalls": rules}
    if arch is not None:
        profile["architectures"] = [arch]
    return json.dumps(profile)
