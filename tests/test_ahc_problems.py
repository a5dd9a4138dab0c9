"""The AtCoder problems as the run and the CLI see them: the text the model reads, the options,
parsing, duplicates, the configurations with the paper's settings, `discover judge` and
`discover evaluate --cases --json`, and the pre-flight checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.app import app
from discover.config import load_config, parse_config
from discover.preflight import PreflightError, preflight
from evaluators.algorithms.cases import public_inputs, select_cases
from evaluators.registry import get_problem

REPO = Path(__file__).resolve().parents[1]
EXAMPLE_039 = "6\n15000 25000\n80000 25000\n80000 60000\n65000 60000\n65000 35000\n15000 35000\n"
RECTANGLE = '#include <cstdio>\nint main() { puts("4\\n20000 20000\\n80000 20000\\n80000 80000\\n20000 80000"); }\n'


def test_the_vendored_inputs_are_the_150_public_cases() -> None:
    for contest, first_line in (("ahc039", "5000"), ("ahc058", "10 4 500 1")):
        inputs = public_inputs(contest)
        assert sorted(inputs) == list(range(150))
        assert all(text.splitlines()[0] == first_line for text in inputs.values())


def test_case_selection() -> None:
    assert select_cases("0-3, 7,9-10", range(150)) == [0, 1, 2, 3, 7, 9, 10]
    assert select_cases(None, range(150)) == list(range(150))
    assert select_cases([5, 1, 5], range(150)) == [1, 5]
    for bad, message in (("3-1", "empty"), ("0-150", "no case 150"), ("a-b", "neither a number nor a range")):
        with pytest.raises(ValueError, match=message):
            select_cases(bad, range(150))


@pytest.mark.parametrize("name", ["ahc039", "ahc058"])
def test_the_description_states_the_live_limits(name: str) -> None:
    p = get_problem(name, cases="0-9")
    text = p.description
    assert "$" not in text and "g++ -std=gnu++20 -O2 -DONLINE_JUDGE -DATCODER" in text
    assert "10 (0-9) of the contest's public cases" in text and "2 s of CPU time and 1024 MB" in text
    assert "2 s of CPU time and 512 MB" in p.with_limits(memory_mb=512).description
    assert "all 150" in get_problem(name).description
    assert p.image == "cpp20" and p.needs_sandbox and isinstance(p.target, float) and p.target > 1


def test_seeds_parse_and_duplicates() -> None:
    p039, p058 = get_problem("ahc039"), get_problem("ahc058")
    seed = p039.seeds(None, 2)
    assert len(seed) == 2 and "int main" in seed[0].code and seed[0].construction is None
    assert p058.seeds(None, 1)[0].code == "" and p058.render_state("", None).startswith("No program yet")
    assert p058.verify(None).valid and p058.verify(None).reward == 0.0
    assert not p058.verify({"cases": []}).valid
    answer = "text\n```python\nprint(1)\n```\n```cpp\nint main() { return 0; }\n```\nmore"
    assert p039.parse(answer) == "int main() { return 0; }"
    assert p039.parse("no code here") is None
    # two programs equal up to comments and whitespace are one state, whatever their results
    a = p039.archive_key("int main() {\n  return 0; // done\n}", {"cases": [[0, "AC", 5, 0.1, 3.0]]})
    b = p039.archive_key("int main(){return 0;} /* same */", {"cases": [[0, "AC", 7, 0.2, 3.0]]})
    assert a == b != p039.archive_key("int main(){return 1;}", None)


def test_initial_program_option(tmp_path: Path) -> None:
    start = tmp_path / "start.cpp"
    start.write_text(RECTANGLE)
    assert get_problem("ahc039", initial_program=str(start)).seeds(None, 1)[0].code == RECTANGLE
    with pytest.raises(ValueError, match="does not exist"):
        get_problem("ahc058", initial_program=str(tmp_path / "absent.cpp")).seeds(None, 1)


def test_configurations_carry_the_papers_settings() -> None:
    a, b = load_config(REPO / "configs" / "ahc039.yaml"), load_config(REPO / "configs" / "ahc058.yaml")
    assert (a.problem, a.train.kl_coef, a.sampling.thinking_budget, a.train.learning_rate) == ("ahc039", 0.01, 22000, 4e-5)
    assert (b.problem, b.train.kl_coef, b.sampling.thinking_budget, b.train.learning_rate) == ("ahc058", 0.01, 25000, 2e-5)
    assert a.sandbox.timeout_s == b.sandbox.timeout_s == 530 and a.sandbox.memory_mb == 1024


def test_preflight_names_bad_options_and_a_missing_compiler(tmp_path: Path, monkeypatch) -> None:
    base = {"problem": "ahc039", "run_dir": str(tmp_path / "r"), "sandbox": {"backend": "process"}}
    with pytest.raises(PreflightError, match="cases: no case 150"):
        preflight(parse_config({**base, "problem_options": {"cases": "0-150"}}))
    with pytest.raises(PreflightError, match="initial_program .* does not exist"):
        preflight(parse_config({**base, "problem_options": {"initial_program": str(tmp_path / "x.cpp")}}))
    import shutil

    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    with pytest.raises(PreflightError, match="needs g\\+\\+ here"):
        preflight(parse_config(base))


def test_with_cases_changes_only_the_copy_and_the_description_follows() -> None:
    p = get_problem("ahc039")
    q = p.with_cases("0-2", stop_at_first_failure=False)
    assert q.cases == [0, 1, 2] and not q.stop_at_first_failure and q.inputs()[2] == (2, public_inputs("ahc039")[2])
    assert p.cases == list(range(150)) and p.stop_at_first_failure  # the original is untouched
    assert "3 (0-2)" in q.description and "all 150" in p.description
    assert q.case_input(7) == public_inputs("ahc039")[7]
    with pytest.raises(KeyError, match="no case 150; the public cases are 0-149"):
        q.case_input(150)


def test_discover_judge_prints_valid_score_and_reason(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    out.write_text(EXAMPLE_039)
    result = CliRunner().invoke(app, ["judge", "ahc039", "0", str(out), "--json"])
    assert result.exit_code == 0
    assert json.loads(result.output) == {
        "problem": "ahc039",
        "valid": True,
        "score": 1739,
        "reason": "",
        "mackerels": 2481,
        "sardines": 743,
        "vertices": 6,
        "polygons": 1,
    }
    inp = tmp_path / "in.txt"
    inp.write_text(public_inputs("ahc058")[3])
    out.write_text("-1\n" * 499)
    result = CliRunner().invoke(app, ["judge", "ahc058", str(inp), str(out)])
    assert result.exit_code == 1 and result.output.strip() == "invalid: only 499 actions; the output must hold exactly T = 500 actions"
    assert CliRunner().invoke(app, ["judge", "erdos", "0", str(out)]).exit_code == 2
    assert "no such input file" in CliRunner().invoke(app, ["judge", "ahc039", "150", str(out)]).output


def test_discover_evaluate_prints_the_per_case_summary(tmp_path: Path) -> None:
    program = tmp_path / "prog.cpp"
    program.write_text(RECTANGLE)
    result = CliRunner().invoke(app, ["evaluate", "ahc039", str(program), "--cases", "0-2", "--json", "--sandbox", "process"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output.strip().splitlines()[-1])
    assert out["valid"] and out["cases_passed"] == 3 and [c["case"] for c in out["cases"]] == [0, 1, 2]
    assert out["reward"] == pytest.approx(sum(c["score"] for c in out["cases"]) / 3 / 1500)
    assert set(out["cases"][0]) == {"case", "verdict", "score", "cpu_s", "peak_mb", "reason"}
    assert out["cases_total"] == 3 and out["mean_score"] == pytest.approx(out["reward"] * 1500)
    missing = CliRunner().invoke(app, ["evaluate", "ahc039", str(program), "--cases", "148-150"])
    assert missing.exit_code == 2 and "cases: no case 150; the cases are 0-149" in missing.output
    refused = CliRunner().invoke(app, ["evaluate", "erdos", str(program), "--cases", "0-2"])
    assert refused.exit_code == 2 and "apply to problems with test cases; problem 'erdos' has none" in refused.output
    text = CliRunner().invoke(app, ["evaluate", "ahc039", str(program), "--cases", "0-2", "--sandbox", "process"]).output
    assert "| case | verdict | score | cpu_s | peak_mb | reason |" in text and "cases_passed 3, cases_total 3, mean_score" in text


def test_the_report_shows_the_best_programs_cases() -> None:
    """The AtCoder problems' report section: the best state's construction, case by case."""
    from types import SimpleNamespace

    p = get_problem("ahc039")
    cases = [[0, "AC", 1200, 0.5, 10.0], [1, "WA", 0, 0.25, 12.5]]
    best = SimpleNamespace(id="abc", reward=0.4, step=3, is_seed=False, code="", construction={"cases": cases})
    seed = SimpleNamespace(id="s", reward=0.0, step=0, is_seed=True, code="", construction=None)
    [section] = p.report_sections([best, seed])
    assert section.title == "Per-case results of the best program"
    assert section.columns == ("case", "verdict", "score", "cpu_s", "peak_mb")
    assert section.rows[1] == {"case": 1, "verdict": "WA", "score": 0, "cpu_s": 0.25, "peak_mb": 12.5}
    assert "State `abc` (reward 0.4, step 3): 1/2 cases accepted, mean case score 600.0 (min 0, max 1200)" in section.text
    assert p.report_sections([seed]) == [] and p.report_sections([]) == []


def test_summary_metrics_are_cases_and_mean_score() -> None:
    from evaluators.base import EvalResult

    p = get_problem("ahc058")
    verdict = EvalResult(
        reward=1.0, valid=True, metrics={"cases_passed": 2, "cases_run": 2, "cases_total": 2, "mean_score": 5.0, "cases": []}
    )
    assert p.summary_metrics(verdict) == {"cases_passed": 2.0, "cases_total": 2.0, "mean_score": 5.0}
    assert p.summary_metrics(EvalResult.invalid("compile error")) == {}
