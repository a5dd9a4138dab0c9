"""docs/new-domain.md followed literally, so that the tutorial cannot rot unnoticed.

The page's conventions, which this test reads (the page states them at its head):

- a file to create is named on the line right before its block, as `` `path`: ``;
- the registry edit is the block under a paragraph "In `path`, add one entry to `NAME`": its lines
  go at the end of the dict `NAME`, as a reader would add them;
- a ```bash block holds commands, run from the repository's root; a `# ` line under a command is
  what it prints (`...` marks text left out), and every such line must appear in its output.

The repository's packages are copied into a temporary directory (the real tree is never touched),
the page's steps are applied there in order and its commands run in a subprocess with PYTHONPATH
at the copy: `.venv/bin/discover` as `python -m cli`, `.venv/bin/pytest` and `.venv/bin/ruff` as
`python -m pytest` and `python -m ruff`. The short run of section 5 is the one slow part and has a
test of its own.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "new-domain.md"
COPIED = ("cli", "flows", "discover", "evaluators", "storage", "configs", "tests", "pyproject.toml")
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", ".cache", ".venv", ".git", "runs")
# `.venv/bin/<tool>` on the page, as run here (the interpreter running the tests, with PYTHONPATH at the copy).
TOOLS = {"discover": "-m cli", "pytest": "-m pytest", "ruff": "-m ruff"}
# The page's run (10 steps of 4 groups of 8 rollouts, about ten minutes on two cores) made as small as
# still runs every task of a step; the rest of the configuration is the page's as written.
RUN_OVERRIDES = {"steps": 1, "groups": 1, "rollouts_per_group": 2}

_FENCE = re.compile(r"```(\w*)")
_FILE_LINE = re.compile(r"`([\w./-]+)`:")
_EDIT = re.compile(r"In `([\w./-]+)`, add one entry to `(\w+)`")
_HEREDOC = re.compile(r"<<-?\s*'?(\w+)'?")
_TOOL = re.compile(r"(?<![\w/.])\.venv/bin/([\w-]+)")


@dataclasses.dataclass
class Command:
    line: int  # the page's line number
    text: str  # as on the page, a here-document included
    prints: list[str] = dataclasses.field(default_factory=list)  # the `# ` lines under it


@dataclasses.dataclass
class Step:
    kind: str  # "file", "edit" or "commands"
    line: int
    path: str = ""
    text: str = ""
    target: str = ""  # an edit's dict
    commands: list[Command] = dataclasses.field(default_factory=list)

    @property
    def is_run(self) -> bool:
        """The block that starts a discovery run (and inspects it)."""
        return any(re.search(r"\.venv/bin/discover run\b", c.text) for c in self.commands)


def _commands(body: list[str], first_line: int) -> list[Command]:
    commands: list[Command] = []
    k = 0
    while k < len(body):
        line = body[k]
        if not line.strip():
            k += 1
        elif line.startswith("#"):
            assert commands, f"docs/new-domain.md line {first_line + k}: output shown before any command"
            commands[-1].prints.append(line[2:].rstrip() if line.startswith("# ") else line[1:].rstrip())
            k += 1
        else:
            start, heredoc = k, _HEREDOC.search(line)
            k = body.index(heredoc.group(1), k + 1) + 1 if heredoc else k + 1
            commands.append(Command(first_line + start, "\n".join(body[start:k]) + "\n"))
    return commands


def parse_page(text: str) -> list[Step]:
    """The page's steps in order: every fenced block is a file, an edit or commands."""
    lines = text.splitlines()
    steps: list[Step] = []
    i = 0
    while i < len(lines):
        fence = _FENCE.fullmatch(lines[i])
        if not fence:
            i += 1
            continue
        end = lines.index("```", i + 1)
        body, lang = lines[i + 1 : end], fence.group(1)
        top = i  # the paragraph above the block: lines[top:bottom]
        while top > 0 and not lines[top - 1].strip():
            top -= 1
        bottom = top
        while top > 0 and lines[top - 1].strip():
            top -= 1
        paragraph = [line.strip() for line in lines[top:bottom]]
        file_line = _FILE_LINE.fullmatch(paragraph[-1]) if paragraph else None
        edit = _EDIT.search(" ".join(paragraph))
        if lang == "bash":
            steps.append(Step("commands", i + 1, commands=_commands(body, i + 2)))
        elif file_line:
            steps.append(Step("file", i + 1, path=file_line.group(1), text="\n".join(body) + "\n"))
        elif edit:
            steps.append(Step("edit", i + 1, path=edit.group(1), target=edit.group(2), text="\n".join(body) + "\n"))
        elif lang != "text":
            pytest.fail(
                f"docs/new-domain.md line {i + 1}: a ```{lang} block that is neither commands (```bash), a file "
                "(a line `path`: right before it) nor an edit (In `path`, add one entry to `NAME`); see this test's docstring"
            )
        i = end + 1
    return steps


def apply_file(root: Path, step: Step) -> None:
    target = root / step.path
    assert target.parent.is_dir(), f"docs/new-domain.md line {step.line}: {step.path}'s folder was never created"
    target.write_text(step.text)


def apply_edit(root: Path, step: Step) -> None:
    """Add the page's lines at the end of the dict `step.target` of `step.path`."""
    target = root / step.path
    lines = target.read_text().splitlines(keepends=True)
    start = next((n for n, line in enumerate(lines) if re.match(rf"{step.target}\b.*=\s*\{{\s*$", line)), None)
    assert start is not None, f"docs/new-domain.md line {step.line}: no dict {step.target} in {step.path}"
    close = next(n for n in range(start, len(lines)) if lines[n].rstrip() == "}")
    lines[close:close] = [step.text]
    target.write_text("".join(lines))


def shell(command: Command) -> str:
    """The page's command as run here: `.venv/bin/<tool>` through this interpreter."""

    def tool(match: re.Match) -> str:
        if match.group(1) not in TOOLS:
            pytest.fail(f"docs/new-domain.md line {command.line}: add .venv/bin/{match.group(1)} to this test's TOOLS")
        return f"{shlex.quote(sys.executable)} {TOOLS[match.group(1)]}"

    return _TOOL.sub(tool, command.text)


def run_commands(root: Path, step: Step, env: dict[str, str], timeout: float) -> list[tuple[Command, subprocess.CompletedProcess]]:
    return [
        (c, subprocess.run(["bash", "-c", shell(c)], cwd=root, env=env, capture_output=True, text=True, timeout=timeout))
        for c in step.commands
    ]


def check(command: Command, proc: subprocess.CompletedProcess) -> None:
    """The command succeeded and printed each line the page shows under it."""
    where = f"docs/new-domain.md line {command.line}: {command.text.splitlines()[0]!r}"
    assert proc.returncode == 0, f"{where} exited with {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    out = [line.rstrip() for line in proc.stdout.splitlines()]
    for shown in command.prints:
        pattern = ".*".join(map(re.escape, shown.split("...")))
        assert any(re.fullmatch(pattern, line) for line in out), f"{where} does not print {shown!r}; it printed:\n{proc.stdout[-3000:]}"


def page_env(root: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of the page's commands: PYTHONPATH at the copy only; no outer pytest's options.
    DISCOVER_ALLOW_UNBOUNDED_PROCESS_TREE passes, as in tests/conftest.py, where no cgroup can be made."""
    env = {k: v for k, v in (base or os.environ).items() if not k.startswith(("PYTEST_", "PYTHONPATH"))}
    if not base:
        env = {k: v for k, v in env.items() if not k.startswith(("PREFECT_", "DISCOVER_"))}
    env["PYTHONPATH"] = str(root)
    if "DISCOVER_ALLOW_UNBOUNDED_PROCESS_TREE" in os.environ:
        env["DISCOVER_ALLOW_UNBOUNDED_PROCESS_TREE"] = os.environ["DISCOVER_ALLOW_UNBOUNDED_PROCESS_TREE"]
    return env


@pytest.fixture(scope="module")
def followed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Step], list[tuple[Command, subprocess.CompletedProcess]]]:
    """A copy of the repository with the page followed in order up to its run: (root, steps, the
    commands run with their results)."""
    steps = parse_page(PAGE.read_text())
    root = tmp_path_factory.mktemp("new-domain")
    for name in COPIED:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, root / name, ignore=IGNORED)
        else:
            shutil.copy2(source, root / name)
    env = page_env(root)
    ran: list[tuple[Command, subprocess.CompletedProcess]] = []
    for step in steps:
        if step.kind == "file":
            apply_file(root, step)
        elif step.kind == "edit":
            apply_edit(root, step)
        elif not step.is_run:
            ran += run_commands(root, step, env, timeout=900)
    return root, steps, ran


def test_the_page_creates_its_files_and_its_checks_pass(followed) -> None:
    root, steps, ran = followed
    kinds = [(s.kind, s.path) for s in steps if s.kind != "commands"]
    assert kinds == [
        ("file", "evaluators/subsetsums/problem.py"),
        ("edit", "evaluators/registry.py"),
        ("file", "configs/subset-sums.yaml"),
        ("file", "tests/test_subset_sums.py"),
    ]
    assert (root / "evaluators" / "subsetsums" / "__init__.py").read_text() == ""
    assert sum(s.is_run for s in steps) == 1, "the page shows one short run"
    commands = [c.text for c, _ in ran]
    for wanted in ("discover verify subset-sums", "discover evaluate subset-sums", "pytest tests/test_subset_sums.py", "ruff check"):
        assert any(wanted in c for c in commands), f"the page no longer runs {wanted!r}"
    for command, proc in ran:
        check(command, proc)
        if "pytest" in command.text:  # every test of the page's file ran and passed, none was skipped
            (page_tests,) = [s.text.count("\ndef test_") for s in steps if s.path == "tests/test_subset_sums.py"]
            passed = re.search(r"\b(\d+) passed\b", proc.stdout)
            assert passed and int(passed.group(1)) >= page_tests and " skipped" not in proc.stdout, proc.stdout[-3000:]


@pytest.mark.slow
def test_the_pages_short_run_finishes_and_reports(followed, cli_env: dict[str, str]) -> None:
    root, steps, _ = followed
    config = root / "configs" / "subset-sums.yaml"
    text = config.read_text()
    for key, value in RUN_OVERRIDES.items():
        text, count = re.subn(rf"^{key}: .*$", f"{key}: {value}", text, flags=re.MULTILINE)
        assert count == 1, f"configs/subset-sums.yaml on the page has no top-level {key}"
    config.write_text(text)
    (run,) = [s for s in steps if s.is_run]
    for command, proc in run_commands(root, run, page_env(root, cli_env), timeout=1800):
        check(command, proc)

    from discover.run import TASKS

    run_dir = root / "runs" / "subset-sums"
    finished = json.loads((run_dir / "manifest.json").read_text())["tasks"]
    assert sorted(finished) == sorted(f"{step}/{task}" for step in range(RUN_OVERRIDES["steps"]) for task in TASKS)
    report = (run_dir / "report" / "report.md").read_text(errors="replace")
    assert "## Best sets" in report  # the problem's report_sections
