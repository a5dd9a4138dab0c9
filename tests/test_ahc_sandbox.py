"""C++ programs evaluated on the AtCoder problems, on both sandbox backends (issue 8, Must show 4):
a trivial valid program scores what the judge says; a program that exceeds the time limit on one
case, one that uses 2 GB, one that crashes, one that does not compile and one that prints garbage
each get reward 0 with the right verdict; hostile programs that fork away, try to kill the runner
or read what is not theirs change nothing; nothing any of them starts survives the evaluation.

Docker cases skip with the reason when no engine answers or the cpp20 image is missing (`make
test` builds it). The process backend is held to the same promises here because the tests run as
root (as CI does), where it drops each program to a uid of its own.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from evaluators.algorithms.ahc039 import judge as judge039
from evaluators.algorithms.cases import public_inputs
from evaluators.registry import get_problem
from tests.sandbox_backends import either_backend

CASES = "0-3"
RECTANGLE = 'printf("4\\n20000 20000\\n80000 20000\\n80000 80000\\n20000 80000\\n");'
MARKER = f"discover-ahc-test-marker-{os.getpid()}"  # this test process's: other xdist workers run these programs too


def program(body: str, headers: str = "") -> str:
    return "#include <cstdio>\n#include <cstdlib>\n#include <csignal>\n#include <unistd.h>\n" + headers + "int main() {\n" + body + "\n}\n"


VALID = program(RECTANGLE + " return 0;")
X2, Y2 = map(int, public_inputs("ahc039")[2].split()[1:3])  # case 2's first mackerel
SLOW_ON_CASE_2 = program(
    f'int n, x, y; if (scanf("%d %d %d", &n, &x, &y) != 3) return 1;\n'
    f"if (x == {X2} && y == {Y2}) {{ volatile unsigned long k = 0; for (;;) k++; }}\n" + RECTANGLE
)
TWO_GB = program(
    'std::vector<char> v(2000000000ULL); for (size_t i = 0; i < v.size(); i += 4096) v[i] = 1;\nprintf("%d\\n", v[4096]);',
    headers="#include <vector>\n",
)
CRASH = program("volatile int *p = nullptr; *p = 1; " + RECTANGLE)
NO_COMPILE = program("return undefined_name;")
GARBAGE = program('printf("the best net is a circle\\n");')
LEAVES_A_CHILD = program(f'if (fork() == 0) {{ setsid(); execl("/bin/sleep", "{MARKER}", "1000", (char *)0); _exit(0); }}\n' + RECTANGLE)
TRIES_TO_KILL_THE_RUNNER = program("kill(getppid(), SIGKILL); kill(-1, SIGKILL); " + RECTANGLE)
SNOOPS = program(
    # the case's input file and the runner's files sit next to the program's directory on the host;
    # its cwd is not writable (docker) or a tmpfs of its own sandbox (process): what it leaves there
    # is nobody's (tests/test_os_isolation.py, a case finds nothing an earlier one left)
    'char runner_out[64]; snprintf(runner_out, sizeof runner_out, "/proc/%d/fd/1", (int)getppid());\n'
    'const char *paths[] = {"../io/input", "../io", "/proc/1/environ", runner_out};\n'
    'for (const char *p : paths) { FILE *f = fopen(p, "r"); if (f) { printf("read %s\\n", p); return 0; } }\n' + RECTANGLE,
)
FLOODS = program('for (;;) fputs("0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\\n", stdout);')
SLEEPS = program("sleep(1000); " + RECTANGLE)


@pytest.fixture(scope="module", params=["process", "docker"])
def sandbox(request):
    yield from either_backend(request.param, "cpp20")
    assert not _native_containers()


def _native_containers() -> list:
    """This test process's compiled-program containers (another process on the same engine, a
    benchmark or a second test session, has its own)."""
    from evaluators.sandbox.docker_engine import OWNER_LABEL, _owner, sandbox_containers

    owner = _owner()
    return [c for c in sandbox_containers() if c.labels.get("discover.sandbox.kind") == "native" and c.labels.get(OWNER_LABEL) == owner]


@pytest.fixture(scope="module", autouse=True)
def _own_session_dirs(tmp_path_factory):
    """The process backend's session directories (and so its programs' paths) in a folder of this
    test process: another xdist worker's compiled programs are not this module's survivors."""
    import tempfile

    before = tempfile.tempdir
    tempfile.tempdir = str(tmp_path_factory.mktemp("native-sessions"))
    yield
    tempfile.tempdir = before


def _program_pids() -> list[int]:
    """Live processes (containers' included) that a program of this test process started: its
    binary (under this process's session folder, or in one of its containers), or the marker of the
    child it leaves behind."""
    import tempfile

    mine = tempfile.gettempdir().encode()
    try:
        containers = [c.id for c in _native_containers()]
    except Exception:  # noqa: BLE001  (no Docker engine here: no container either)
        containers = []
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            in_ours = b"/tmp/judge-" in cmdline and any(c in (entry / "cgroup").read_text() for c in containers)
        except (OSError, IndexError):
            continue
        ours = MARKER.encode() in cmdline or (b"/bin/main" in cmdline and (mine in cmdline or in_ours))
        if ours and state != "Z":
            found.append(int(entry.name))
    return found


def evaluate(sandbox, source: str, problem: str = "ahc039", **options):
    p = get_problem(problem, cases=CASES, **options)
    start = time.monotonic()
    result = p.evaluate(source, None, sandbox)
    assert time.monotonic() - start < 600
    # Killed processes are gone once they are scheduled to exit: polled, generous for a loaded machine.
    deadline = time.monotonic() + 60
    while _program_pids() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _program_pids(), "a process of the program survived the evaluation"
    assert os.getppid() > 1
    return result


def verdicts(result) -> dict[int, str]:
    return {row["case"]: row["verdict"] for row in result.metrics["cases"]}


def test_a_valid_program_scores_the_judges_mean(sandbox) -> None:
    result = evaluate(sandbox, VALID)
    expected = [judge039(public_inputs("ahc039")[c], "4\n20000 20000\n80000 20000\n80000 80000\n20000 80000\n").score for c in range(4)]
    assert result.valid and result.reason == ""
    assert [row["score"] for row in result.metrics["cases"]] == expected
    assert result.reward == pytest.approx(sum(expected) / 4 / 1500)
    assert result.metrics["cases_passed"] == 4 and verdicts(result) == {c: "AC" for c in range(4)}
    assert all(row["cpu_s"] >= 0 and row["peak_mb"] > 0 for row in result.metrics["cases"])
    assert result.construction["cases"][0][:3] == [0, "AC", expected[0]]


def test_too_slow_on_one_case_is_tle_and_scores_zero(sandbox) -> None:
    result = evaluate(sandbox, SLOW_ON_CASE_2, stop_at_first_failure=False)
    assert result.reward == 0 and not result.valid
    assert verdicts(result) == {0: "AC", 1: "AC", 2: "TLE", 3: "AC"}
    assert result.reason.startswith("case 2: TLE: ")


def test_two_gigabytes_is_mle(sandbox) -> None:
    result = evaluate(sandbox, TWO_GB)
    assert result.reward == 0 and set(verdicts(result).values()) == {"MLE"}
    assert "MLE" in result.reason


def test_a_crash_is_re(sandbox) -> None:
    result = evaluate(sandbox, CRASH)
    assert result.reward == 0 and set(verdicts(result).values()) == {"RE"}
    assert "killed by SIGSEGV" in result.reason


def test_a_compile_error_is_kept_as_the_reason(sandbox) -> None:
    result = evaluate(sandbox, NO_COMPILE)
    assert result.reward == 0 and not result.valid
    assert result.reason.startswith("compile error") and "undefined_name" in result.reason


def test_garbage_is_wa_with_the_judges_reason(sandbox) -> None:
    result = evaluate(sandbox, GARBAGE)
    assert result.reward == 0 and set(verdicts(result).values()) == {"WA"}
    assert "'the', not an integer" in result.reason


def test_the_first_failure_stops_the_evaluation_unless_asked_to_go_on(sandbox) -> None:
    stopped = get_problem("ahc039", cases="0-19").evaluate(GARBAGE, None, sandbox)
    assert stopped.metrics["cases_run"] < 20  # the cases already started when the first WA came
    everything = evaluate(sandbox, GARBAGE, stop_at_first_failure=False)
    assert everything.metrics["cases_run"] == 4


@pytest.mark.parametrize(
    "source, verdict",
    [(LEAVES_A_CHILD, "AC"), (TRIES_TO_KILL_THE_RUNNER, "AC"), (SNOOPS, "AC"), (FLOODS, "WA"), (SLEEPS, "TLE")],
    ids=["leaves-a-child", "kills-the-runner", "snoops", "floods-output", "sleeps"],
)
def test_hostile_programs_change_nothing(sandbox, source: str, verdict: str) -> None:
    result = evaluate(sandbox, source)
    assert set(verdicts(result).values()) == {verdict}, result.reason
    if verdict == "AC":
        assert result.valid and result.reward > 0
    else:
        assert result.reward == 0


def test_an_ahc058_plan_runs_and_is_judged(sandbox) -> None:
    plan = program('for (int t = 0; t < 500; t++) puts(t == 0 ? "0 0" : "-1"); puts("# done");')
    result = evaluate(sandbox, plan, problem="ahc058")
    assert result.valid  # 0^0 costs 1 on every generated input: S = 1 + 499 A[0] = 500
    assert [row["score"] for row in result.metrics["cases"]] == [round(1e5 * 8.965784284662087)] * 4


def test_the_evaluation_deadline_counts(sandbox) -> None:
    p = get_problem("ahc039", cases=CASES).with_limits(timeout_s=0.001)
    result = p.evaluate(VALID, None, sandbox)
    assert not result.valid and "time limit (0.001 s) ran out" in result.reason
