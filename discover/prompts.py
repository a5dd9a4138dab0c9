"""Context building for a group (SPEC §4): description, parent state, its score, an observation."""

from __future__ import annotations

OBSERVATION_CHARS = 2000  # tail of the parent's output shown to the model


def build_context(description: str, rendered_state: str, reward: float, observation: str = "") -> str:
    """The text the model sees for one group (SPEC §4, "The context for a group").

    The score is printed with a fixed number of decimals so that contexts of the same problem
    differ only where their states differ.
    """
    parts = [description.strip(), "", rendered_state.strip(), "", f"Score of the current state: {reward:.6f}"]
    if observation.strip():
        parts += ["", "Output of the current state's program (last lines):", observation[-OBSERVATION_CHARS:].rstrip()]
    return "\n".join(parts) + "\n"
