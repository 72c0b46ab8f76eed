"""The configuration file says what runs as root: only root may change it, as a hook file, and
its state_dir must be able to hold the state and its lock. Each refusal names the file and the
problem, exit 2, no traceback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import cli

WHY = "it says what the daemon runs as root"


def _config(directory: Path, state: Path | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "config.yaml"
    path.write_text(f"state_dir: {state or directory / 'state'}\nhooks: {{}}\nevents: {{}}\n")
    return path


def _refused(path: Path, problem: str) -> None:
    result = cli("check-config", "--quiet", "--config", str(path))
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"error: {problem}" in result.stderr.splitlines(), result.stderr
    assert "Traceback" not in result.stderr


def test_a_config_file_others_can_write_is_refused(tmp_path):
    """Before: a 0666 config naming `/bin/sh -c ...` as a hook passed check-config (exit 0)."""
    path = _config(tmp_path)
    path.chmod(0o666)
    _refused(path, f"{path}: writable by group or others; {WHY}")
    path.chmod(0o664)
    _refused(path, f"{path}: writable by group or others; {WHY}")


def test_a_config_file_another_user_owns_is_refused(tmp_path):
    path = _config(tmp_path)
    os.chown(path, 65534, 65534)
    _refused(path, f"{path}: owned by uid 65534, not root; {WHY}")


def test_a_config_file_in_a_directory_others_can_write_is_refused(tmp_path):
    """Whoever can write the directory can replace the file: a 0777 folder without the sticky
    bit; a sticky one (/tmp, where the suite's own configs live) is fine."""
    shared = tmp_path / "shared"
    path = _config(shared)
    shared.chmod(0o777)
    _refused(
        path,
        f"{path}: its directory {shared} is writable by group or others, who could replace "
        f"the configuration; {WHY}",
    )
    shared.chmod(0o1777)
    assert cli("check-config", "--quiet", "--config", str(path)).returncode == 0


def test_a_symlinked_config_is_checked_at_its_target(tmp_path):
    path = _config(tmp_path / "real")
    link = tmp_path / "config.yaml"
    link.symlink_to(path)
    path.chmod(0o666)
    _refused(link, f"{link} (-> {path}): writable by group or others; {WHY}")


def test_a_config_others_can_write_is_told_with_its_other_problems(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(f"state_dir: {tmp_path}/s\napprove: sometimes\nhooks: {{}}\nevents: {{}}\n")
    path.chmod(0o666)
    result = cli("check-config", "--quiet", "--config", str(path))
    assert result.returncode == 2
    assert f"error: {path}: writable by group or others; {WHY}" in result.stderr
    assert f"error: {path}: approve:" in result.stderr
    assert f"{path}: 2 problem(s); nothing was started" in result.stderr


@pytest.mark.parametrize("command", ["check-config", "run"])
def test_a_state_dir_that_is_a_file_is_a_config_error(tmp_path, command):
    """Before: check-config said OK and `run` only logged state_degraded, taking no lock, so
    two daemons on that config both ran the hooks and both approved."""
    blocker = tmp_path / "stfile"
    blocker.write_text("")
    path = _config(tmp_path, state=blocker)
    result = cli(command, "--config", str(path), timeout=30)
    assert result.returncode == 2, result.stdout + result.stderr
    assert (
        f"error: {path}: state_dir: {blocker}: not a directory; the daemon keeps its state and "
        "its lock in it" in result.stderr.splitlines()
    ), result.stderr
    assert "Traceback" not in result.stderr
