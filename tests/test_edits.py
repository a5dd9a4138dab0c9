"""Answers as edits (discover/edits.py, docs/method.md "Answers as edits"): SEARCH/REPLACE blocks
applied to the parent's program, and every way an answer's edits can fail to apply."""

from __future__ import annotations

import pytest

from discover.edits import EditError, apply_edits, parse_blocks

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
