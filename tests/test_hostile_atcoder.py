"""Hostile C++ programs on the AtCoder problems, on both sandbox backends (issue 21, B5).

Each program tries to get more than an honest program would, or to break the judge on the host:
megabytes of output, numbers too long for Python's `int()`, a fork bomb, reading the other cases'
inputs and the evaluator's files, writing files for a later case. Each must end with a verdict
(never an exception out of the evaluation) and a reward no higher than the honest baseline (the
rectangle every one of them prints when its attack fails). Under Docker every attack fails, and so
under the process backend, whose view holds the program's binary and its own directory only
(docs/sandbox.md); as root (as CI runs) each program also has a uid of its own. Docker cases skip
with the reason when the cpp20 image is missing.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from evaluators.algorithms.cases import archive_path
from evaluators.registry import get_problem
from tests.sandbox_backends import either_backend

CASES = "0-1"
RECT = "4\\n20000 20000\\n80000 20000\\n80000 80000\\n20000 80000\\n"
HONEST_BODY = f'printf("{RECT}");'
WIN = 'printf("4\\n0 0\\n100000 0\\n100000 100000\\n0 100000\\n");'  # what an attack that worked prints instead (a different score)
HEAD = "#include <cstdio>\n#include <cstdlib>\n#include <cstring>\n#include <unistd.h>\n#include <sys/wait.h>\n"


def program(body: str) -> str:
    return HEAD + "int main() {\n" + body + "\n}\n"


HONEST = program(HONEST_BODY)
# 31 MiB of tiny nets, then the honest one last (the official tool scores the last): the judge must
# read it in bounded memory and give the honest score, no more
TINY_NETS = program(
    'static char buf[1 << 16]; size_t n = 0; const char *t = "4\\n0 0\\n1 0\\n1 1\\n0 1\\n"; size_t k = strlen(t);\n'
    "while (n + k <= sizeof buf) { memcpy(buf + n, t, k); n += k; }\n"
    "for (int i = 0; i < 31 * 16; i++) fwrite(buf, 1, n, stdout);\n" + HONEST_BODY
)
OVER_THE_CAP = program(
    "static char buf[1 << 20]; memset(buf, ' ', sizeof buf); for (int i = 0; i < 40; i++) fwrite(buf, 1, sizeof buf, stdout);" + HONEST_BODY
)
HUGE_NUMBER = program('printf("4\\n"); for (int i = 0; i < 5000; i++) putchar(\'7\'); printf(" 0\\n");' + HONEST_BODY)
HUGE_LAST = program(HONEST_BODY + 'printf("4\\n"); for (int i = 0; i < 5000; i++) putchar(\'9\'); printf("\\n");')
FORK_BOMB = program("for (int i = 0; i < 200; i++) if (fork() == 0) { for (;;) fork(); }\n" + HONEST_BODY)


def reads(*paths: str) -> str:
    """A program that prints the winning net when it can read any of `paths`, else the honest one."""
    listed = ", ".join(f'"{p}"' for p in paths)
    return program(
        f"const char *paths[] = {{{listed}}};\n"
        'for (const char *p : paths) { FILE *f = fopen(p, "r"); if (f && fgetc(f) != EOF) { ' + WIN + " return 0; } }\n" + HONEST_BODY
    )


# the runner's files: the case's input file next to the program's directory (the other cases' pass
# through the same place), the environment of PID 1
READS_THE_RUNNERS_FILES = reads("../io/input", "../io", "/proc/1/environ")
# the repository: every case's input (public, but not the program's to read) and the judge's source
READS_THE_REPOSITORY = reads(str(archive_path("ahc039")), str(Path(__file__).resolve().parents[1] / "evaluators/algorithms/ahc039.py"))
WRITES_FILES = program(
    'const char *paths[] = {"/tmp/discover-hostile-atcoder", "./left-behind", "../left-behind"};\n'
    'for (const char *p : paths) { FILE *f = fopen(p, "r"); if (f) { ' + WIN + " return 0; } }\n"
    'for (const char *p : paths) { FILE *f = fopen(p, "w"); if (f) { fputs("x", f); fclose(f); } }\n' + HONEST_BODY
)


@pytest.fixture(scope="module", params=["process", "docker"])
def sandbox(request):
    yield from either_backend(request.param, "cpp20")


@pytest.fixture(scope="module")
def baseline(sandbox) -> float:
    result = get_problem("ahc039", cases=CASES).evaluate(HONEST, None, sandbox)
    assert result.valid and result.reward > 0, result.reason
    return result.reward


def _strict(sandbox) -> bool:
    """Host isolation is promised under Docker, and for the process backend only as root."""
    return sandbox.name == "docker" or os.geteuid() == 0


def evaluate(sandbox, source: str):
    result = get_problem("ahc039", cases=CASES, stop_at_first_failure=False).evaluate(source, None, sandbox)
    assert os.getppid() > 1
    return result


def verdicts(result) -> set[str]:
    return {row["verdict"] for row in result.metrics.get("cases", [])}


def test_megabytes_of_tiny_nets_score_the_last_net_and_no_more(sandbox, baseline: float) -> None:
    result = evaluate(sandbox, TINY_NETS)
    assert result.valid and verdicts(result) == {"AC"}, result.reason
    assert result.reward == pytest.approx(baseline)


def test_output_over_the_cap_is_a_wrong_answer(sandbox, baseline: float) -> None:
    result = evaluate(sandbox, OVER_THE_CAP)
    assert result.reward == 0 and verdicts(result) == {"WA"}
    assert "output too large" in result.reason


@pytest.mark.parametrize("source", [HUGE_NUMBER, HUGE_LAST], ids=["first", "after-the-net"])
def test_a_5000_digit_number_is_a_wrong_answer_not_an_exception(sandbox, baseline: float, source: str) -> None:
    result = evaluate(sandbox, source)
    assert result.reward == 0 and verdicts(result) == {"WA"}
    assert "out of the 64-bit range" in result.reason


def test_a_fork_bomb_gains_nothing(sandbox, baseline: float) -> None:
    result = evaluate(sandbox, FORK_BOMB)
    assert result.reward <= baseline + 1e-12
    assert verdicts(result) <= {"AC", "RE", "TLE", "MLE"}, result.reason


@pytest.mark.parametrize(
    "source",
    [READS_THE_RUNNERS_FILES, READS_THE_REPOSITORY, WRITES_FILES],
    ids=["reads-the-runners-files", "reads-the-repository", "writes-files"],
)
def test_what_is_not_the_programs_stays_out_of_reach(sandbox, baseline: float, source: str) -> None:
    if not _strict(sandbox):
        pytest.skip("the process backend isolates files only when the tests run as root")
    for _ in range(2):  # twice: a file written by the first evaluation must not be there for the second
        result = evaluate(sandbox, source)
        assert result.valid and verdicts(result) == {"AC"}, result.reason
        assert result.reward == pytest.approx(baseline)
    assert not Path("/tmp/discover-hostile-atcoder").exists()
