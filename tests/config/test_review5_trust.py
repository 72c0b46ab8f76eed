"""Review of fix/trust (e3eb381): the config file's trust is judged on the real file and the
directories above it, never on the way there. A symbolic link in a directory others can write
(no sticky bit) can be replaced by any of them with their own link, and the daemon (root) then
reads whatever root-owned file they point it at, or nothing (it no longer starts). The link's
own directory is now checked too (and a hook's, the same rule)."""

from __future__ import annotations

from tests.config.test_trust import _config
from tests.conftest import cli


def test_a_config_reached_through_a_link_others_can_replace_is_refused(tmp_path):
    real = _config(tmp_path / "safe")  # root's, 0644, in a 0755 directory: trusted
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # anyone may unlink config.yaml here and put their own link
    link = shared / "config.yaml"
    link.symlink_to(real)
    result = cli("check-config", "--quiet", "--config", str(link))
    assert result.returncode == 2, "its link can be retargeted by anyone: " + result.stderr
    assert str(shared) in result.stderr
