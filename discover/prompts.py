"""Context building for a group (docs/method.md §4 and §5a): the problem, the parent state, its score change,
the target, and the tail of the parent's output, as the released prompts show them; under
`sampling.answer_format: edits`, the SEARCH/REPLACE format the answer must take (discover/edits.py)."""

from __future__ import annotations

import re

from discover.edits import edits_instruction

# how the problems' `render_state` shows a state's program: "Code:" and a fenced block (evaluators/base.py)
_STATE_PROGRAM = re.compile(r"Code:\n```[\w+#.-]*\n(.*?)\n```", re.DOTALL)
OBSERVATION_CHARS = 500  # docs/method.md §5a: the released prompts show the last 500 characters of the parent's output


def build_context(
    description: str,
    rendered_state: str,
    reward: float,
    observation: str = "",
    previous_reward: float | None = None,
    target: float | None = None,
    answer_format: str = "program",
) -> str:
    """The text the model sees for one group (docs/method.md §4, "The context for a group"; docs/method.md §5a).

    `previous_reward` is the grandparent's score (None for a seed), shown as "before -> after";
    `target` the problem's goal in reward units (None: none shown). Scores are printed with a fixed
    number of decimals so that contexts of the same problem differ only where their states differ.
    `answer_format` "edits" ends the context with the edit format (docs/method.md, "Answers as edits"),
    which replaces the problem description's request for a whole program, shown on a line of the
    state's program when it has one.
    """
    parts = [description.strip(), "", rendered_state.strip(), ""]
    if previous_reward is None:
        parts.append(f"Score of the current state: {reward:.6f}")
    else:  # docs/method.md §5a: the score change from the grandparent to the parent
        parts.append(f"Score of the current state: {previous_reward:.6f} -> {reward:.6f} (its parent -> it)")
    if target is not None:  # docs/method.md §5a: a target value for the problem
        parts.append(f"Target score: {target:.6f} (higher is better)")
    if observation.strip():
        parts += ["", "Output of the current state's program (last characters):", observation[-OBSERVATION_CHARS:].rstrip()]
    if answer_format == "edits":
        program = _STATE_PROGRAM.search(rendered_state)
        parts += ["", edits_instruction(program.group(1) if program else "")]
    return "\n".join(parts) + "\n"
