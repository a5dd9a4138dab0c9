"""Answers as edits (discover/edits.py, docs/method.md "Answers as edits"): SEARCH/REPLACE blocks
applied to the parent's program, and every way an answer's edits can fail to apply."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from discover import steps
from discover.config import ConfigError, parse_config
from discover.edits import EDITS_NOT_APPLIED, EditError, apply_edits, example_block, parse_blocks
from discover.metrics import step_metrics
from discover.preflight import PreflightError, preflight
from discover.prompts import build_context
from discover.run import Run, load_archive, read_evaluations, read_rollouts

PARENT = """import numpy as np


def construct(parent):
    n = 26
    step = 0.1
    for i in range(n):
        step = step * 0.9
    return [[0.5, 0.5, 0.1]] * n
"""

CPP_PARENT = """#include <bits/stdc++.h>
using namespace std;

int main() {
    int n;
    cin >> n;
    for (int i = 0; i < n; i++) {
        cout << i << endl;
    }
    return 0;
}
"""


def block(search: str, replace: str) -> str:
    return f"<<<<<<< SEARCH\n{search}\n=======\n{replace}\n>>>>>>> REPLACE\n"


def test_a_block_that_matches_once_replaces_its_lines() -> None:
    answer = "I make the step smaller.\n" + block("    step = 0.1", "    step = 0.05")
    assert apply_edits(PARENT, answer) == PARENT.replace("step = 0.1", "step = 0.05")


def test_blocks_inside_a_code_fence_with_text_around_them_apply() -> None:
    answer = "```python\n" + block("    n = 26", "    n = 26  # circles") + "```\nThat is all."
    assert apply_edits(PARENT, answer) == PARENT.replace("    n = 26\n", "    n = 26  # circles\n")


def test_several_blocks_apply_in_order_each_against_the_original_program() -> None:
    answer = (
        block("    step = 0.1", "    step = 0.2")
        + "and then\n"
        + block("    return [[0.5, 0.5, 0.1]] * n", "    out = [[0.5, 0.5, step]] * n\n    return out")
        + block("import numpy as np", "import math\nimport numpy as np")
    )
    expected = (
        PARENT.replace("step = 0.1", "step = 0.2")
        .replace("    return [[0.5, 0.5, 0.1]] * n", "    out = [[0.5, 0.5, step]] * n\n    return out")
        .replace("import numpy as np", "import math\nimport numpy as np")
    )
    assert apply_edits(PARENT, answer) == expected
    # a later block's SEARCH is looked up in the original program, not in the first block's result
    chained = block("    step = 0.1", "    step = 0.2") + block("    step = 0.2", "    step = 0.3")
    with pytest.raises(EditError, match=r"block 2 \(SEARCH starts 'step = 0.2'\) matches no place"):
        apply_edits(PARENT, chained)


def test_a_block_that_does_not_match_is_named_by_index_and_first_line() -> None:
    answer = block("    step = 0.1", "    step = 0.2") + block("    for j in range(n):\n        pass", "")
    with pytest.raises(EditError, match=r"block 2 \(SEARCH starts 'for j in range\(n\):'\) matches no place"):
        apply_edits(PARENT, answer)


def test_a_block_that_matches_two_places_asks_for_more_context() -> None:
    program = "x = 1\ny = 2\nx = 1\n"
    with pytest.raises(EditError, match=r"block 1 \(SEARCH starts 'x = 1'\) matches 2 places; include more context"):
        apply_edits(program, block("x = 1", "x = 3"))
    assert apply_edits(program, block("y = 2\nx = 1", "y = 2\nx = 3")) == "x = 1\ny = 2\nx = 3\n"


def test_overlapping_blocks_are_refused_naming_both() -> None:
    answer = (
        block("def construct(parent):\n    n = 26", "def construct(parent):\n    n = 32")
        + block("    n = 26\n    step = 0.1", "    n = 26\n    step = 0.5")
        + block("    step = 0.1\n    for i in range(n):", "")
    )
    with pytest.raises(EditError, match=r"blocks 1 and 2 overlap"):
        apply_edits(PARENT, answer)
    adjacent = block("    n = 26", "    n = 32") + block("    step = 0.1", "    step = 0.5")
    assert apply_edits(PARENT, adjacent) == PARENT.replace("n = 26", "n = 32").replace("step = 0.1", "step = 0.5")


def test_an_answer_without_a_block_and_an_empty_or_unclosed_search_are_refused() -> None:
    with pytest.raises(EditError, match="no SEARCH/REPLACE block"):
        apply_edits(PARENT, "```python\ndef construct(parent):\n    return []\n```")
    with pytest.raises(EditError, match="block 1 has an empty SEARCH part"):
        apply_edits(PARENT, "<<<<<<< SEARCH\n=======\nx = 1\n>>>>>>> REPLACE\n")
    with pytest.raises(EditError, match="block 1 has an empty SEARCH part"):
        apply_edits(PARENT, block("\n", "x = 1"))
    with pytest.raises(EditError, match=r"block 2 is not closed \(no '>>>>>>> REPLACE' line"):
        apply_edits(PARENT, block("    n = 26", "    n = 27") + "<<<<<<< SEARCH\n    step = 0.1\n=======\n    step = 0.")
    with pytest.raises(EditError, match="block 1 is not closed"):
        apply_edits(PARENT, "<<<<<<< SEARCH\n    step = 0.1\n")


def test_trailing_whitespace_is_tolerated_only_when_no_exact_match_exists_and_indentation_never() -> None:
    assert apply_edits(PARENT, block("    step = 0.1   ", "    step = 0.3")) == PARENT.replace("step = 0.1", "step = 0.3")
    with pytest.raises(EditError, match="block 1 .* matches no place"):
        apply_edits(PARENT, block("step = 0.1", "step = 0.3"))  # the indentation is part of the line
    # exact first: "a " matches exactly once, though "a" and "a " would match twice without their trailing space
    assert apply_edits("a\na \nb\n", block("a ", "c")) == "a\nc\nb\n"


def test_a_cpp_parent_is_edited_like_any_program() -> None:
    answer = (
        "Faster output:\n```cpp\n"
        + block("#include <bits/stdc++.h>\nusing namespace std;", "#include <bits/stdc++.h>\nusing namespace std;\n#define FAST 1")
        + block("        cout << i << endl;", "        cout << i << '\\n';")
        + "```\n"
    )
    edited = apply_edits(CPP_PARENT, answer)
    assert edited == CPP_PARENT.replace("using namespace std;\n", "using namespace std;\n#define FAST 1\n").replace(
        "cout << i << endl;", "cout << i << '\\n';"
    )
    with pytest.raises(EditError, match=r"block 1 \(SEARCH starts 'for \(int i = 0; i <= n; i\+\+\) \{'\) matches no place"):
        apply_edits(CPP_PARENT, block("    for (int i = 0; i <= n; i++) {", "    for (int i = 1; i <= n; i++) {"))


def test_parse_blocks_keeps_the_blocks_lines_in_order() -> None:
    blocks = parse_blocks(block("a\nb", "c") + "between\n" + block("d", ""))
    assert [(b.search, b.replace) for b in blocks] == [(("a", "b"), ("c",)), (("d",), ("",))]


# ---------------------------------------------------------------------------------------------
# The configuration, the pre-flight and a short run of circle packing with scripted answers.

STARTER = (Path(__file__).resolve().parents[1] / "evaluators" / "math" / "starters" / "circles_grow.py").read_text()
MALFORMED = [
    "I would make the circles bigger.",  # no block
    "```python\ndef construct(parent):\n    return parent\n```",  # a whole program, not an edit
    block("    for _ in range(99):", "    for _ in range(5):"),  # matches nothing
    "<<<<<<< SEARCH\n    for _ in range(20):\n=======\n    for _ in range(",  # cut off
]
GOOD = block("    for _ in range(20):", "    for _ in range(5):") + block(
    "    return np.column_stack([xy, r]).tolist()", "    return np.column_stack([xy, 0.99 * r]).tolist()"
)
EDITED = STARTER.replace("range(20)", "range(5)").replace("[xy, r]", "[xy, 0.99 * r]")


class ScriptedSampler:
    """A sampler whose k-th completion of every context answers `answers[k % len(answers)]`."""

    contexts: list[str] = []  # every context it was given, for the test to read

    def __init__(self, answers: list[str]) -> None:
        self.answers = answers

    def sample_stream(self, contexts, k, sampling, seed, skip=frozenset()):
        from discover.records import Completion

        ScriptedSampler.contexts += contexts
        for g in range(len(contexts)):
            for j in range(k):
                if (g, j) in skip:
                    continue
                answer = self.answers[j % len(self.answers)]
                ids = [10 + j, 11, 12, 13]  # the tokens the rollout keeps, whatever its text
                yield g, j, Completion([1, 2, 3], ids, [-1.0] * len(ids), [1] * len(ids), answer, answer)

    def while_training(self):
        return contextlib.nullcontext()


def _scripted(monkeypatch: pytest.MonkeyPatch, answers: list[str]) -> None:
    """Every policy the run loads samples `answers`; its trainer is the tiny model's."""
    import discover.policy

    real = discover.policy.load_policy

    def load(*args, **kwargs):
        policy = real(*args, **kwargs)
        policy.sampler = ScriptedSampler(answers)
        return policy

    monkeypatch.setattr(discover.policy, "load_policy", load)
    ScriptedSampler.contexts = []


def _circles_config(run_dir: Path, model: Path, **overrides) -> dict:
    config = {
        "problem": "circles-26",
        "run_dir": str(run_dir),
        "steps": 2,
        "groups": 1,
        "rollouts_per_group": 4,
        "model": {"name": str(model), "lora_rank": 4, "device": "cpu"},
        "sampling": {"context_tokens": 4096, "thinking_budget": 4096, "max_answer_tokens": 64, "answer_format": "edits"},
        "sandbox": {"backend": "process", "timeout_s": 60, "concurrency": 2},
        "problem_options": {"starter": "circles_grow.py"},
    }
    config.update(overrides)
    return config


def _run(config: dict) -> tuple[Run, list[dict]]:
    """The run's five tasks of every step, as the step flow calls them, and each step's metrics record."""
    run = steps.create_run(parse_config(config))
    steps.initialise(run)
    records = []
    for step in range(run.config.steps):
        for task in (steps.select_parents, steps.generate, steps.evaluate, steps.update_archive, steps.train):
            task(run, step)
        records.append(step_metrics(run, step))
    return run, records


def test_edits_are_refused_for_mixed_groups_for_answers_that_are_not_programs_and_for_seeds_without_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="sampling.answer_format: Input should be 'program' or 'edits'"):
        parse_config({"problem": "toy", "sampling": {"answer_format": "diff"}})
    with pytest.raises(ConfigError, match="cannot be used with MIGRATE's mixed groups"):
        parse_config({"problem": "circles-26", "sampling": {"answer_format": "edits"}, "mixed": {"greedy": 1}})
    toy = parse_config({"problem": "toy", "run_dir": str(tmp_path / "toy"), "sampling": {"answer_format": "edits"}})
    with pytest.raises(PreflightError, match="answers of problem toy are not programs; or use sampling.answer_format: program"):
        preflight(toy)
    bare = _circles_config(tmp_path / "bare", Path("tiny"), problem_options={})
    bare["model"] = {"name": "tiny"}
    with pytest.raises(PreflightError, match="seed states of problem circles-26 carry no program to edit; .*starter"):
        preflight(parse_config(bare))
    assert not (tmp_path / "toy").exists() and not (tmp_path / "bare").exists()


@pytest.mark.slow
def test_a_run_of_malformed_edits_finishes_with_every_answer_invalid_and_its_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, long_context_tiny_model: Path
) -> None:
    _scripted(monkeypatch, MALFORMED)
    run, records = _run(_circles_config(tmp_path / "run", long_context_tiny_model))
    assert ScriptedSampler.contexts and all(
        "<<<<<<< SEARCH" in c and "for _ in range(20):" in c and "Answer format: do not write a whole program" in c
        for c in ScriptedSampler.contexts
    )
    for step, record in enumerate(records):
        evaluations = read_evaluations(run.layout.evaluations(step))
        assert [e.reward for e in evaluations] == [0.0] * 4 and not any(e.valid for e in evaluations)
        reasons = [e.reason for e in evaluations]
        assert (
            reasons[0]
            == reasons[1]
            == f"{EDITS_NOT_APPLIED}: no SEARCH/REPLACE block (an edit is '<<<<<<< SEARCH', lines, '=======', lines, '>>>>>>> REPLACE')"
        )
        assert reasons[2] == f"{EDITS_NOT_APPLIED}: block 1 (SEARCH starts 'for _ in range(99):') matches no place of the parent's program"
        assert reasons[3].startswith(f"{EDITS_NOT_APPLIED}: block 1 is not closed")
        assert [e.code for e in evaluations] == [""] * 4
        assert record["answer/edits_applied"] == 0.0 and record["reward/valid_fraction"] == 0.0
        rollouts = read_rollouts(run.layout.rollouts(step))
        assert [r.answer for r in rollouts] == MALFORMED and [r.completion_ids[0] for r in rollouts] == [10, 11, 12, 13]
    assert len(load_archive(run.layout.archive(2))) == 1  # the seed alone


@pytest.mark.slow
def test_a_run_of_edits_that_apply_evaluates_and_archives_the_edited_parent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, long_context_tiny_model: Path
) -> None:
    _scripted(monkeypatch, [GOOD, MALFORMED[2]])
    run, records = _run(_circles_config(tmp_path / "run", long_context_tiny_model, steps=1))
    evaluations = read_evaluations(run.layout.evaluations(0))
    assert [e.valid for e in evaluations] == [True, False, True, False]
    assert evaluations[0].code == evaluations[2].code == EDITED != STARTER
    assert evaluations[0].reward > 0 and evaluations[1].reason.startswith(EDITS_NOT_APPLIED)
    assert records[0]["answer/edits_applied"] == 0.5 and records[0]["reward/valid_fraction"] == 0.5
    children = [s for s in load_archive(run.layout.archive(1)).states.values() if not s.is_seed]
    assert [s.code for s in children] == [EDITED]  # the edited program, once (the repeat is a duplicate)


PROGRAM_PROBLEMS = ["ac2", "ahc039", "trimul", "denoising"]  # Python, C++, a Triton kernel, Python on data


@pytest.mark.parametrize("name", PROGRAM_PROBLEMS)
def test_the_seed_program_of_each_program_problem_takes_an_edit_copied_from_its_context(name: str) -> None:
    import numpy as np

    from discover.preflight import check_answer_format
    from evaluators.registry import get_problem

    problem = get_problem(name)
    check_answer_format(parse_config({"problem": name, "sampling": {"answer_format": "edits"}}), problem)  # not refused
    code = problem.seeds(np.random.default_rng(0), 1)[0].code
    lines = code.split("\n")
    line = max((s for s in lines if s.strip() and lines.count(s) == 1), key=len)  # the longest line that occurs once
    assert line in problem.render_state(code, None)  # the model sees it in its context
    edited = apply_edits(code, "Duplicated:\n" + block(line, f"{line}\n{line}"))
    i = lines.index(line)
    assert edited.split("\n") == lines[: i + 1] + [line] + lines[i + 1 :]


def test_the_edit_format_is_shown_on_a_line_of_the_parent_and_the_example_applies() -> None:
    """The context's example block quotes a real line of the parent's program (a small model copied
    placeholder lines into its SEARCH part); copied as it is, it applies and changes that one line."""
    context = build_context("Problem.", f"Code:\n```python\n{PARENT.strip()}\n```", 0.5, answer_format="edits")
    example = context[context.index("<<<<<<< SEARCH\n") :]
    assert "<<<<<<< SEARCH\n    for i in range(n):\n" not in example  # no count there: the first line setting one
    assert example.startswith("<<<<<<< SEARCH\n    n = 26\n=======\n    n = 52\n>>>>>>> REPLACE\n")
    assert "lines copied exactly from the current program\n" not in context  # no placeholder line of its own
    assert apply_edits(PARENT, example) == PARENT.replace("n = 26", "n = 52")
    # a count in a loop, a line set twice skipped; without a count a comment line is added; nothing to quote: the placeholders
    assert example_block("x = 1.5\nfor _ in range(20):\n    pass\n") == ("for _ in range(20):", "for _ in range(40):")
    assert example_block("N = 3\nN = 3\ny = f(N)\n") == ("y = f(N)", "y = f(N)\n# (a line added after it)")
    assert example_block("") is None
    seed = build_context("Problem.", "No code yet.", 0.0, answer_format="edits")
    assert "<<<<<<< SEARCH\nlines copied exactly from the current program\n=======\n" in seed


@pytest.mark.parametrize("name", ["ahc058", "erdos"])
def test_problems_whose_seeds_carry_no_program_are_refused_naming_the_fix(name: str) -> None:
    from discover.preflight import check_answer_format
    from evaluators.registry import get_problem

    with pytest.raises(PreflightError, match=f"seed states of problem {name} carry no program to edit; give them one"):
        check_answer_format(parse_config({"problem": name, "sampling": {"answer_format": "edits"}}), get_problem(name))


def _blocks(pairs) -> str:
    return "".join(f"<<<<<<< SEARCH\n{s}\n=======\n{r}\n>>>>>>> REPLACE\n" for s, r in pairs)


def test_thousands_of_blocks_on_a_long_parent_apply_through_the_whitespace_fallback() -> None:
    """The host applies the edits outside any sandbox, so their cost must follow their size: 3,000
    one-line blocks that match only with trailing whitespace stripped, on a 16,000-line parent, apply
    (the fallback no longer strips the whole parent again for every block; benchmarks/edits.py times it)."""
    parent = "\n".join(f"x_{i} = {i}  " for i in range(16000))
    edited = apply_edits(parent, _blocks((f"x_{i} = {i}", f"x_{i} = {-i}") for i in range(0, 15000, 5)))
    lines = edited.split("\n")
    assert len(lines) == 16000 and lines[5] == "x_5 = -5" and lines[6] == "x_6 = 6  " and lines[14995] == "x_14995 = -14995"


def test_blocks_of_lines_that_occur_too_often_are_refused_within_a_bounded_cost() -> None:
    """Each block is looked for only where its rarest line occurs; blocks whose every line occurs
    thousands of times would cost that many places each, so past LOCATE_WORK_PER_LINE per line of
    input the answer is refused, naming why."""
    parent = "a\nb\n" * 8000 + "b\nb"
    with pytest.raises(EditError, match="occur too often in the parent's program to locate them within the cost allowed"):
        apply_edits(parent, _blocks(("a\nb\nb", "c") for _ in range(3000)))
    assert apply_edits(parent, _blocks([("a\nb\nb", "c")])).endswith("a\nb\nc\nb")  # one such block is located
