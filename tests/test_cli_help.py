"""``fedblend --help`` and every subcommand's ``--help`` print the recorded text (``tests/golden/cli_help.txt``).

The command line is assembled from one module per command (:mod:`fedblend.cli.main`); this pins what a user
reads, so a reorganisation of the modules cannot change a flag, its help or the order of the subcommands. A
deliberate change of the help regenerates the file: ``python tests/test_cli_help.py > tests/golden/cli_help.txt``.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from pathlib import Path

RECORDED = Path(__file__).resolve().parent / "golden" / "cli_help.txt"
WIDTH = "100"  # argparse wraps at the terminal's width ($COLUMNS)


def help_texts() -> str:
    """``$ fedblend ARGS`` followed by what the command prints, for ``--help`` and each ``SUBCOMMAND --help``."""
    from fedblend.cli.main import main, parser

    subcommands = parser()._subparsers._group_actions[0].choices  # noqa: SLF001 - argparse has no public API
    out = []
    for argv in [["--help"]] + [[s, "--help"] for s in subcommands]:
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), contextlib.suppress(SystemExit):
            main(argv)
        out.append(f"$ fedblend {' '.join(argv)}\n{buf.getvalue()}")
    return "".join(out)


def test_help_of_every_command_is_the_recorded_text(monkeypatch):
    monkeypatch.setenv("COLUMNS", WIDTH)
    assert help_texts() == RECORDED.read_text()


def test_the_comparison_sees_a_changed_help(monkeypatch):
    """A flag's help changed in the parser is a difference (the test above can fail)."""
    import fedblend.cli.main as cli

    real = cli.parser

    def changed():
        ap = real()
        ap._subparsers._group_actions[0].choices["run"]._option_string_actions["--quiet"].help = "other"  # noqa: SLF001
        return ap

    monkeypatch.setenv("COLUMNS", WIDTH)
    monkeypatch.setattr(cli, "parser", changed)
    assert help_texts() != RECORDED.read_text()


if __name__ == "__main__":
    os.environ["COLUMNS"] = WIDTH
    sys.stdout.write(help_texts())
