"""From what the driver reported and what the checker found to a verdict, on the host (docs/method.md §5c).

The driver's report is untrusted (it shares a process with the candidate): this module checks it
is complete and consistent (every call that was due, distinct fresh seeds for the timed calls,
per-shape means recomputed from the calls themselves), takes correctness from the checker only,
rejects a mean under the roofline floor of the GPU the checker saw, and scores the rest.
"""

from __future__ import annotations

import math
from typing import Any

from evaluators.base import EvalResult
from evaluators.kernels.trimul import roofline

REWARD_SCALE_US = 1500.0  # reward = 1500 / geometric-mean runtime in µs (the released code's score scale)


def reward_for(geomean_us: float) -> float:
    """docs/method.md §5c: reward proportional to 1 / geometric-mean runtime."""
    return REWARD_SCALE_US / geomean_us


def geometric_mean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


# No timed call of an evaluation lasts longer (its whole run has a time limit of minutes): a larger
# time is made up, and would overflow the spread's squares (OverflowError, found by fuzzing)
MAX_CALL_MS = 3_600_000.0


def _finite_ms(value: object) -> bool:
    """A time the driver reported: a positive number of at most MAX_CALL_MS (a JSON integer too
    large for a float is not one)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return 0 < float(value) <= MAX_CALL_MS
    except OverflowError:
        return False


def malformed(report: object) -> str:
    """Why the driver's report does not have the report's shape (it is untrusted), or ""."""
    if not isinstance(report, dict):
        return "the driver's report is not an object"
    calls = report.get("calls")
    if calls is not None and not isinstance(calls, list):
        return "the driver's report holds no list of calls"
    for c in calls or []:
        if not (isinstance(c, dict) and isinstance(c.get("set"), str) and isinstance(c.get("kind", ""), (str, type(None)))):
            return "the driver's report holds a call that is not a call (set, shape, kind)"
        if isinstance(c.get("shape"), bool) or not isinstance(c.get("shape"), int):
            return "the driver's report holds a call without a shape number"
    versions = report.get("versions")
    if versions is not None and not (isinstance(versions, dict) and all(isinstance(versions.get(k), str) for k in ("torch", "triton"))):
        return "the driver's report names no torch and triton versions"
    benchmarks = report.get("benchmarks")
    if benchmarks is not None and not isinstance(benchmarks, list):
        return "the driver's report holds no list of benchmarks"
    if not all(isinstance(b, dict) for b in benchmarks or []):
        return "the driver's report holds a benchmark that is not an object"
    return ""


def report_problem(job: dict, report: dict) -> str:
    """Why the driver's report cannot be scored (its own error or rejection, a malformed report, or a gap in it), or ""."""
    shape = malformed(report)
    if shape:
        return shape
    for key in ("error", "rejected"):
        if report.get(key):
            return str(report[key])[:2000]
    if "versions" not in report:
        return "the driver's report names no torch and triton versions"
    calls = report.get("calls") or []
    for i, seeds in enumerate(job["test_seeds"]):
        got = [c for c in calls if c.get("set") == "tests" and c.get("shape") == i]
        if len(got) != len(seeds):
            return f"the driver reported {len(got)} calls on test shape {i}, {len(seeds)} were due"
    for i in range(len(job["benchmarks"])):
        mine = [c for c in calls if c.get("set") == "benchmarks" and c.get("shape") == i]
        timed = [c for c in mine if c.get("kind") == "timed"]
        kinds = sorted(str(c.get("kind")) for c in mine if c.get("kind") != "timed")
        if kinds != ["warmup"] or len(timed) < job["timing"]["min_calls"]:
            return f"the driver's report of benchmark shape {i} is incomplete"
        if len({repr(c.get("seed")) for c in timed}) != len(timed):  # repr: a seed the report made a list is still compared
            return f"benchmark shape {i}: timed calls repeated an input seed (every call must get fresh inputs)"
        if any(not _finite_ms(c.get("ms")) for c in timed):
            return f"benchmark shape {i}: a timed call has no time between 0 and {MAX_CALL_MS:g} ms"
    return ""


def runtimes_us(job: dict, report: dict) -> list[float]:
    """Mean runtime per benchmark shape in µs, from the timed calls themselves."""
    means = []
    for i in range(len(job["benchmarks"])):
        ms = [float(c["ms"]) for c in report["calls"] if c["set"] == "benchmarks" and c["shape"] == i and c["kind"] == "timed"]
        means.append(1e3 * sum(ms) / len(ms))
    return means


def spread_us(job: dict, report: dict) -> list[float]:
    out = []
    for i in range(len(job["benchmarks"])):
        ms = [float(c["ms"]) for c in report["calls"] if c["set"] == "benchmarks" and c["shape"] == i and c["kind"] == "timed"]
        mean = sum(ms) / len(ms)
        out.append(1e3 * (sum((v - mean) ** 2 for v in ms) / max(1, len(ms) - 1)) ** 0.5)
    return out


def below_floor(job: dict, means_us: list[float], gpu_name: str) -> str:
    """Why a mean is faster than `gpu_name` can go (roofline.py), or ""."""
    peak = roofline.peaks_for(gpu_name)
    for i, (shape, mean) in enumerate(zip(job["benchmarks"], means_us)):
        floor = roofline.floor_us(shape, peak)
        if mean < floor:
            return (
                f"benchmark shape {i} ({describe(shape)}) ran in {mean:.2f} µs, under the floor of {floor:.2f} µs "
                f"that {peak.model} allows ({peak.bandwidth_gb_s:g} GB/s, {peak.tensor_tflops:g} TFLOP/s): faster than the hardware"
            )
    return ""


def label(shape: dict) -> str:
    """A short name of a benchmark shape, for table columns: "B2 N256 C128 normal"."""
    return f"B{shape['bs']} N{shape['seqlen']} C{shape['dim']} {shape['distribution']}" + ("" if shape["nomask"] else " mask")


def describe(shape: dict) -> str:
    mask = "no mask" if shape["nomask"] else "mask"
    return f"B={shape['bs']} N={shape['seqlen']} C={shape['dim']} H={shape['hiddendim']}, {shape['distribution']}, {mask}"


def checker_failure(checked: dict) -> str:
    """What the checker reported wrong (its error, else its failure), or "": a blank one (found by
    fuzzing: a failure of "\\r" made an invalid verdict without a reason) is said as such."""
    said = checked.get("error") or checked.get("failure")
    if not said:
        return ""
    return str(said).strip()[:2000] or "the checker reported a failure without saying which"


def timed_verdict(job: dict, report: dict, checked: dict, logs: str) -> EvalResult:
    """The verdict of a GPU evaluation whose driver and checker both ran."""
    why = report_problem(job, report)
    if why:
        return EvalResult.invalid(why, observation=logs)
    why = checker_failure(checked)
    if why:
        return EvalResult.invalid(why, observation=logs)
    if checked.get("checked") != len(report["calls"]):
        return EvalResult.invalid(f"the checker judged {checked.get('checked')} of {len(report['calls'])} calls", observation=logs)
    gpu = str(checked.get("gpu") or (report.get("gpu") or {}).get("name") or "")
    means = runtimes_us(job, report)
    why = below_floor(job, means, gpu)
    if why:
        return EvalResult.invalid(why, observation=logs)
    geomean = geometric_mean(means)
    spreads = spread_us(job, report)
    lines = [f"{gpu}, torch {report['versions']['torch']}, triton {report['versions']['triton']}: geometric mean {geomean:.1f} µs"]
    lines += [f"  {describe(s)}: {m:.1f} ± {sd:.1f} µs" for s, m, sd in zip(job["benchmarks"], means, spreads)]
    construction: dict[str, Any] = {
        "gpu": gpu,
        "torch": report["versions"]["torch"],
        "triton": report["versions"]["triton"],
        "geomean_us": geomean,
        "runtimes_us": means,
        "std_us": spreads,
        "timed_calls": [b.get("calls") for b in report.get("benchmarks", [])],
    }
    metrics = {"geomean_us": geomean, **{f"us {label(s)}": m for s, m in zip(job["benchmarks"], means)}}
    summary = "\n".join(lines)
    return EvalResult(
        reward=reward_for(geomean),
        valid=True,
        construction=construction,
        metrics=metrics,
        observation=(logs + "\n" if logs else "") + summary,
    )
