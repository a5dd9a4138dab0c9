"""TriMul's CPU check and the hostile TriMul kernels through the Docker backend in the `gpu` image,
beside the process backend: the same verdict for every kernel (no device request: this runs on a
machine without a GPU; the check is Triton's interpreter and the CPU clock).

    python benchmarks/trimul_gpu_image.py [--out benchmarks/results]

Needs the image (`make images IMAGES=gpu`). Writes trimul_gpu_image.{json,md}: the image's size and
id, and per kernel each backend's verdict (passed, or the first words of its rejection) and time.
Times are of this machine (2 cores, two evaluations at once) and only show both backends ran the
kernel; what the check compares is each backend's honest kernel against its attacks.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from evaluators.kernels.trimul.problem import INITIAL_KERNEL, TriMulProblem  # noqa: E402
from evaluators.sandbox import ProcessSandbox, docker_unavailable  # noqa: E402
from tests.test_hostile_trimul import OUTCOMES, PASSED  # noqa: E402
from tests.trimul_kernels import ATTACKS, CORRECT_TORCH  # noqa: E402

PROBLEM = TriMulProblem(device="cpu", cpu_timing=True)


def kernels() -> dict[str, str]:
    return {"initial": INITIAL_KERNEL, "honest": CORRECT_TORCH, **{name: source for name, (source, _) in sorted(ATTACKS.items())}}


def verdicts(box, sources: dict[str, str]) -> dict[str, dict]:
    def one(source: str) -> dict:
        start = time.monotonic()
        v = PROBLEM.run_checks(source, box, False)
        return {
            "passed": v.reason.startswith(PASSED),
            "reward": v.reward,
            "reason": v.reason[:160],
            "cpu_best_us": v.metrics.get("cpu_best_us"),
            "seconds": round(time.monotonic() - start, 1),
        }

    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(one, src) for name, src in sources.items()}
        return {name: f.result() for name, f in futures.items()}


def expected(name: str) -> str:
    if name in ("initial", "honest"):
        return "timed"
    outcome = OUTCOMES[name]
    return outcome if isinstance(outcome, str) else " or ".join(outcome)


def same(a: dict, b: dict, name: str) -> bool:
    """Both backends gave the kernel the outcome the hostile suite expects (timed, or rejected for its reason)."""
    want = expected(name)
    if want == "timed":
        return a["passed"] and b["passed"] and a["reward"] == b["reward"] == 0.0
    phrases = want.split(" or ")
    return all(not v["passed"] and any(p in v["reason"] for p in phrases) for v in (a, b))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()
    why = docker_unavailable(PROBLEM.image)
    if why:
        print(f"the docker backend cannot run here: {why}", file=sys.stderr)
        return 2
    from evaluators.sandbox.docker import DockerSandbox
    from evaluators.sandbox.docker_engine import image_ref

    inspect = json.loads(
        subprocess.run(["docker", "image", "inspect", image_ref(PROBLEM.image)], capture_output=True, text=True, check=True).stdout
    )[0]
    sources = kernels()
    start = time.monotonic()
    process = verdicts(ProcessSandbox(image="gpu"), sources)
    with DockerSandbox(image=PROBLEM.image, concurrency=2) as box:
        docker = verdicts(box, sources)
    rows = [
        {"kernel": n, "expected": expected(n), "process": process[n], "docker": docker[n], "agree": same(process[n], docker[n], n)}
        for n in sources
    ]
    doc = {
        "image": image_ref(PROBLEM.image),
        "image_id": inspect["Id"],
        "image_bytes": inspect["Size"],
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE.parent).stdout.strip(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "seconds": round(time.monotonic() - start, 1),
        "rows": rows,
        "all_agree": all(r["agree"] for r in rows),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "trimul_gpu_image.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = [
        "# TriMul's CPU check in the `gpu` image: Docker backend beside the process backend",
        "",
        f"`python benchmarks/trimul_gpu_image.py` at commit {doc['commit']}, {doc['date']}, on this 2-core CPU machine (no GPU, no device "
        f"request): image {doc['image']} ({doc['image_bytes'] / 1e9:.2f} GB, {doc['image_id'][:19]}), {len(rows)} kernels, "
        f"{doc['seconds']:.0f} s in all. Every kernel's outcome as the hostile suite expects under both backends: "
        f"**{'yes' if doc['all_agree'] else 'NO'}**.",
        "",
        "| kernel | expected | process backend | docker backend | agree |",
        "|---|---|---|---|---|",
    ]

    def cell(v: dict) -> str:
        what = f"timed, best {v['cpu_best_us']:.0f} µs" if v["passed"] else v["reason"][:70].replace("|", "/")
        return f"{what} ({v['seconds']:.0f} s)"

    for r in rows:
        lines.append(f"| {r['kernel']} | {r['expected']} | {cell(r['process'])} | {cell(r['docker'])} | {'yes' if r['agree'] else 'NO'} |")
    (args.out / "trimul_gpu_image.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if doc["all_agree"] else 1


if __name__ == "__main__":
    sys.exit(main())
