"""What a normal user is told when the process backend cannot isolate or bound a run (issue 43): the
setting that applies on this kernel, and for commands that read no configuration the environment
variable."""

from __future__ import annotations

from pathlib import Path

from evaluators.sandbox.bwrap import userns_knob
from evaluators.sandbox.process import ALLOW_ENV, unbounded_message


def _sysctls(root: Path, values: dict[str, str]) -> str:
    for name, value in values.items():
        path = root / name.replace(".", "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(value + "\n")
    return str(root)


def test_the_user_namespace_message_names_the_setting_this_kernel_has(tmp_path: Path) -> None:
    upstream = _sysctls(tmp_path / "upstream", {"user.max_user_namespaces": "0"})
    assert userns_knob(upstream) == "sysctl -w user.max_user_namespaces=15000 (it is 0)"  # no Debian-only knob named
    debian = _sysctls(tmp_path / "debian", {"user.max_user_namespaces": "63000", "kernel.unprivileged_userns_clone": "0"})
    assert userns_knob(debian) == "sysctl -w kernel.unprivileged_userns_clone=1 (it is 0)"
    ubuntu = _sysctls(tmp_path / "ubuntu", {"user.max_user_namespaces": "63000", "kernel.apparmor_restrict_unprivileged_userns": "1"})
    assert "kernel.apparmor_restrict_unprivileged_userns=0" in userns_knob(ubuntu) and "AppArmor profile" in userns_knob(ubuntu)
    allowed = _sysctls(tmp_path / "allowed", {"user.max_user_namespaces": "63000"})
    assert userns_knob(allowed).startswith("they look allowed here")


def test_the_unbounded_tree_message_names_the_config_key_the_variable_and_the_delegation() -> None:
    text = unbounded_message("no cgroup")
    assert "sandbox.allow_unbounded_process_tree: true" in text
    assert f"{ALLOW_ENV}=1" in text and "discover evaluate" in text
    assert "Delegate=yes" in text and "DISCOVER_CGROUP_PARENT" in text
