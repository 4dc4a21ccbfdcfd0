"""`fabricbench --help` is where a new user finds the commands: each with its purpose."""

import pytest

from workloads.commands.cli import COMMANDS, main


def test_help_lists_every_command_with_its_purpose(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps long lines
    assert e.value.code == 0
    for name, (_, purpose) in COMMANDS.items():
        assert f"{name} {purpose}" in out
