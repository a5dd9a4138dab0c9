"""Denoising candidates in the sandbox (docs/method.md §5d): the MAGIC seed's score, every invalid output
with reward 0 and its reason, and a hostile candidate that hunts for the held-out counts.

Each test runs on the process backend and, where the `bio` image is built (`make images`), on
the docker backend.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from evaluators.bio.denoising.problem import DenoisingProblem, program
from evaluators.bio.denoising.report import run_program
from evaluators.sandbox import ProcessSandbox, docker_unavailable
from tests.sandbox_backends import sandboxes_by_backend

WHY_NO_DOCKER = docker_unavailable("bio")
BACKENDS = [
    "process",
    pytest.param("docker", marks=pytest.mark.skipif(bool(WHY_NO_DOCKER), reason=f"bio image not testable here: {WHY_NO_DOCKER}")),
]


@pytest.fixture(scope="module")
def problem() -> DenoisingProblem:
    p = DenoisingProblem()
    p.prepared()  # load and split once for the module
    return p


@pytest.fixture(scope="module")
def boxes():
    yield from sandboxes_by_backend("bio")


def _evaluate(problem: DenoisingProblem, code: str, box) -> object:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the process backend's isolation warning
        return problem.evaluate(code, None, box)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_magic_seed_is_valid_beats_no_denoising_and_is_rewarded_one_over_its_mse(problem, boxes, backend) -> None:
    verdict = _evaluate(problem, program("magic"), boxes(backend))
    assert verdict.valid, verdict.reason + verdict.observation[-2000:]
    m = verdict.metrics
    assert verdict.reward == pytest.approx(1.0 / m["mse"], rel=1e-15)
    assert 0.97 <= m["poisson_normalized"] <= 1.0
    assert m["mse_normalized"] > 0 and m["score"] > 0  # better than no denoising on both metrics
    assert verdict.construction == m  # the state keeps its metrics (report, context)
    # the same program run in this process scores the same: the sandbox changes nothing but the isolation
    here = problem.score_output(run_program("magic", problem.prepared().split))
    assert m == pytest.approx(here.metrics, rel=1e-6)


INVALID = {
    "nan": ("import numpy as np\ndef magic_denoise(X, **kw):\n    Y = X.copy()\n    Y[3, 4] = np.nan\n    return Y\n", "non-finite"),
    "negative": ("def magic_denoise(X, **kw):\n    return X - 0.5\n", "negative values"),
    "wrong shape": ("def magic_denoise(X, **kw):\n    return X[:, 1:]\n", "expected (700, 765)"),
    "too large": (
        "def magic_denoise(X, **kw):\n    Y = X.copy()\n    Y[0, 0] = X.sum() + 1\n    return Y\n",
        "above the train matrix's total",
    ),
    "raising": ("def magic_denoise(X, **kw):\n    raise RuntimeError('boom')\n", "RuntimeError: boom"),
    "not numbers": ("def magic_denoise(X, **kw):\n    return {'a': 1}\n", "not real numbers"),
    "no function": ("def denoise(X):\n    return X\n", "no function `magic_denoise`"),
    "too slow": ("import time\ndef magic_denoise(X, **kw):\n    time.sleep(600)\n", "timeout after 5 s"),
    "too much memory": ("import numpy as np\ndef magic_denoise(X, **kw):\n    return np.ones((60000, 10000))\n", "memory limit (3072 MB)"),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(INVALID))
def test_each_invalid_output_gets_reward_0_with_its_reason(problem, boxes, backend: str, case: str) -> None:
    code, reason = INVALID[case]
    p = problem.with_limits(timeout_s=5.0) if case == "too slow" else problem
    verdict = _evaluate(p, code, boxes(backend))
    assert not verdict.valid and verdict.reward == 0.0
    assert reason in verdict.reason, (verdict.reason, verdict.observation[-1000:])


def test_a_traceback_names_the_candidates_own_lines(problem, boxes) -> None:
    verdict = _evaluate(problem, "import numpy as np\n\ndef magic_denoise(X, **kw):\n    return X @ np.ones(3)\n", boxes("process"))
    assert "matmul" in verdict.reason
    assert 'File "magic_denoise.py", line 4, in magic_denoise' in verdict.observation
    assert "return X @ np.ones(3)" in verdict.observation and "driver" not in verdict.observation


def test_without_isolation_a_warning_says_the_dataset_is_readable(problem) -> None:
    import evaluators.bio.denoising.problem as module

    module._unisolated_warned = False
    with pytest.warns(RuntimeWarning, match="never train untrusted models so"):
        problem.evaluate("def magic_denoise(X, **kw):\n    return X\n", None, ProcessSandbox(isolation="none", image="bio"))


def test_the_old_opt_in_is_accepted_and_says_it_is_no_longer_needed() -> None:
    with pytest.warns(DeprecationWarning, match="allow_process_backend is no longer needed"):
        DenoisingProblem(allow_process_backend=True)


# A candidate that hunts for the held-out counts by every route it has, says what each gave, and
# returns what it found (or its input when nothing): a leak would score normalised MSE 1.
HOSTILE = r"""
import os, sys, time
import numpy as np

TRY_SCANPY = {try_scanpy}


def say(route, outcome):
    print(f"route {{route}}: {{outcome}}", flush=True)


def probe(path):
    try:
        with open(path, "rb") as f:
            return "readable ({{}} bytes)".format(len(f.read(4096)))
    except OSError as e:
        return "denied ({{}})".format(type(e).__name__)


def cmdline(pid):
    try:
        with open(f"/proc/{{pid}}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")[:60].strip()
    except OSError:
        return ""


def hunt_disk(X, data):
    guesses, seen, deadline = [], 0, time.monotonic() + 30
    roots = ["/tmp", "/dev/shm", "/data", "/var/tmp", os.path.dirname(data), os.getcwd(), os.path.expanduser("~")]
    for root in roots:
        for folder, dirs, files in os.walk(root):
            for name in files:
                seen += 1
                path = os.path.join(folder, name)
                if not name.endswith((".npy", ".npz")) or time.monotonic() > deadline:
                    continue
                try:
                    A = np.load(path, allow_pickle=False)
                except Exception:
                    continue
                if isinstance(A, np.ndarray) and A.shape == X.shape and not np.array_equal(A, X):
                    guesses.append((path, A))
    return guesses, seen


def magic_denoise(X, **kwargs):
    data = os.environ.get("DISCOVER_DATA", "")
    say("arguments", f"kwargs {{sorted(kwargs)}} X total {{X.sum():.0f}}")
    print(f"random_state {{kwargs.get('random_state')}} ", flush=True)
    say("environment", " ".join(sorted(os.environ)))
    say("data directory", " ".join(sorted(os.listdir(data))))
    guesses, seen = hunt_disk(X, data)
    say("disk", f"{{len(guesses)}} arrays of shape {{X.shape}} among {{seen}} files: {{[g[0] for g in guesses]}}")
    for name in ("mem", "environ", "maps"):
        say(f"parent {{name}}", probe(f"/proc/{{os.getppid()}}/{{name}}"))
    say("parent cmdline", cmdline(os.getppid()))
    say("processes", " | ".join(c for c in map(cmdline, [p for p in os.listdir("/proc") if p.isdigit()]) if c))
    found = None
    if TRY_SCANPY:
        try:
            import scanpy as sc
            ad = sc.datasets.pbmc68k_reduced()
            full = np.round(np.expm1(ad.raw.X.toarray()) * ad.obs["n_counts"].to_numpy()[:, None] / 1e4)
            found = full - X if full.shape == X.shape else None
            say("scanpy dataset", "read")
        except Exception as e:
            say("scanpy dataset", f"unavailable ({{type(e).__name__}})")
    for path, A in guesses:
        if found is None and (A >= 0).all():
            found = A
    return X if found is None else found
"""

SANDBOX_ENV = {
    "PATH",
    "HOME",
    "TMPDIR",
    "LANG",
    "LC_ALL",
    "PYTHONHASHSEED",
    "PYTHONDONTWRITEBYTECODE",
    "PYTHONNOUSERSITE",
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "DISCOVER_DATA",
    "DISCOVER_OUTPUT_FD",  # the harness's descriptor for the value (process backend)
    "PWD",  # bubblewrap's, of its working directory
    "LC_CTYPE",
}


def _routes(logs: str) -> dict[str, str]:
    return dict(line[len("route ") :].split(": ", 1) for line in logs.splitlines() if line.startswith("route "))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_candidate_hunting_for_the_held_out_counts_gets_nothing_it_can_use(problem, boxes, backend: str) -> None:
    # scanpy's own copy of the default dataset: deleted from the bio image, shown empty in the
    # process sandbox's view (evaluators/sandbox/view.py, HIDDEN_SUFFIXES)
    code = HOSTILE.format(try_scanpy=True)
    verdict = _evaluate(problem.with_limits(timeout_s=300.0), code, boxes(backend))
    routes = _routes(verdict.observation)
    split = problem.prepared().split

    # arguments: only a fixed random_state (not the split's seed), and X is the train half
    assert routes["arguments"] == f"kwargs ['random_state'] X total {split.train_total:.0f}"
    assert "random_state 0 " in verdict.observation
    # environment: nothing but what the sandbox sets; data directory: the train half alone
    assert set(routes["environment"].split()) <= SANDBOX_ENV
    assert routes["data directory"] == "train.npy"
    if backend == "process":
        # the parent is bubblewrap's init in the candidate's PID namespace: another uid's, unreadable
        for name in ("mem", "environ", "maps"):
            assert routes[f"parent {name}"].startswith("denied"), routes
    else:
        # the parent is the container's runner, which never holds the counts
        assert routes["parent cmdline"].startswith("python3 -I -c")
    # this process is not even visible (another PID namespace), and no dataset is left to read
    assert "pytest" not in routes["processes"] and len(routes["processes"].split(" | ")) < 10, routes
    assert routes["scanpy dataset"].startswith("unavailable"), routes
    # and whatever it returned is not the held-out counts
    assert verdict.metrics.get("mse_normalized", 0.0) < 0.5, routes
    assert np.isfinite(verdict.reward) and verdict.reward < 1.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_matrix_larger_than_the_default_file_limit_comes_back_whole(tmp_path, boxes, backend: str) -> None:
    import anndata

    counts = np.random.default_rng(0).poisson(0.3, size=(1500, 6000)).astype(np.float32)
    anndata.AnnData(X=counts).write_h5ad(tmp_path / "large.h5ad")
    large = DenoisingProblem(data=str(tmp_path / "large.h5ad"))
    split = large.prepared().split
    assert split.train.nbytes > 64 * 2**20  # over the sandbox's default file size limit
    verdict = _evaluate(large, "def magic_denoise(X, **kw):\n    return X * 0.5 + 0.0\n", boxes(backend))
    # scaled rows normalise to the train matrix itself: the output came back whole and was scored
    assert verdict.metrics["mse_normalized"] == pytest.approx(0.0, abs=1e-12), verdict.reason
    assert "normalised Poisson" in verdict.reason and verdict.reward == 0.0
