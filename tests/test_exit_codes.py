"""Exit codes as documented (``fedblend.cli.main``), for every command as a class: 2 for bad input (a flag the
command does not have, a config value out of range, a file or folder the user named that cannot be used), 1 for a
fault of the run (data that cannot be read, a full disk, a plug-in whose code raised), each with exactly one
``fedblend: error:`` line. (``run``'s many cases are in ``tests/test_bad_inputs.py``; ``sweep``'s refusals in
``tests/test_workflow.py``.)"""

from __future__ import annotations

import contextlib
import errno
import io
import urllib.error
import urllib.request

import pytest

from fedblend.cli.main import main

SYNTH = ["--set", "dataset=synthetic", "--set", "model=mlp", "--set", "partition.num_clients=3",
         "--set", "partition.min_samples=5", "--set", "log.plot=false"]
FAULTY = ["--set", "method=tests.plugin_faults:Faulty", "--set", "options.hook=reply", "--set",
          'options.fault="raise"']


def _argv(cmd: str, tmp) -> list[str]:
    """A valid invocation of ``cmd`` (bad input or a fault is added to it)."""
    return {
        "run": ["run", *SYNTH, "--set", "rounds=1", "--out", str(tmp / "run"), "--quiet"],
        "partition": ["partition", *SYNTH, "--out", str(tmp / "part")],
        "bench": ["bench", *SYNTH, "--rounds", "1"],
        "pretrain": ["pretrain", *SYNTH, "--set", "method=pfedrlla", "--out", str(tmp / "agent.pt")],
        "sweep": ["sweep", str(_empty_config(tmp)), *SYNTH, "--set", "rounds=1", "--out", str(tmp / "sweep")],
        "deploy": ["deploy", *SYNTH, "--write-app", str(tmp / "app"), "--out", str(tmp / "dep")],
        "report": ["report", str(tmp)],
        "export": ["export", "tensorboard", str(tmp)],
        "methods": ["methods"],
        "configs": ["configs"],
    }[cmd]


def _empty_config(tmp):
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "c.toml").write_text("")
    return tmp / "c.toml"


COMMANDS = ["run", "partition", "bench", "pretrain", "sweep", "deploy", "report", "export", "methods", "configs"]
WITH_CONFIG = ["run", "partition", "bench", "pretrain", "sweep", "deploy"]


def _cli(argv: list[str]) -> tuple[int, list[str]]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(argv)
    lines = [ln for ln in err.getvalue().splitlines() if ln.strip() and not ln.startswith("fedblend: warning:")]
    return rc, lines


def _one_error(rc: int, lines: list[str], code: int, fragment: str) -> None:
    errors = [ln for ln in lines if ln.startswith("fedblend: error: ")]
    assert rc == code and len(errors) == 1 and fragment in errors[0], (rc, lines)
    assert not any("Traceback" in ln for ln in lines), lines


class TestBadInputExits2:
    @pytest.mark.parametrize("cmd", COMMANDS)
    def test_a_flag_the_command_does_not_have(self, tmp_path, cmd):
        _one_error(*_cli([*_argv(cmd, tmp_path), "--no-such-flag"]), 2, "--no-such-flag")

    @pytest.mark.parametrize("cmd", WITH_CONFIG)
    def test_a_config_value_out_of_range(self, tmp_path, cmd):
        _one_error(*_cli([*_argv(cmd, tmp_path), "--set", "train.lr=-1"]), 2, "lr")

    @pytest.mark.parametrize("cmd", ["report", "export"])
    def test_a_folder_that_holds_no_run(self, tmp_path, cmd):
        _one_error(*_cli(_argv(cmd, tmp_path / "empty")), 2, "empty")

    def test_methods_with_a_name_that_is_none(self):
        _one_error(*_cli(["methods", "nosuch"]), 2, "no method or transform 'nosuch'")


def _no_network(monkeypatch):
    def refuse(*a, **k):
        raise urllib.error.URLError("network disabled in tests")

    monkeypatch.setattr(urllib.request, "urlopen", refuse)


class TestFaultsExit1:
    @pytest.mark.parametrize("cmd", ["run", "partition", "bench", "pretrain"])
    def test_data_that_cannot_be_read(self, tmp_path, monkeypatch, cmd):
        _no_network(monkeypatch)
        (tmp_path / "data").mkdir()
        argv = [*_argv(cmd, tmp_path), "--set", "dataset=mnist", "--set", "model=lenet5", "--data-dir",
                str(tmp_path / "data")]
        _one_error(*_cli(argv), 1, "mnist")

    @pytest.mark.parametrize("cmd", ["run", "bench"])
    def test_a_plugin_whose_code_raises(self, tmp_path, cmd):
        _one_error(*_cli([*_argv(cmd, tmp_path), *FAULTY]), 1, "method plug-in 'faulty-plugin'")

    def test_a_sweep_whose_run_fails(self, tmp_path):
        """A run of the sweep that exits 1 (a plug-in's fault) makes the sweep exit 1."""
        rc, lines = _cli([*_argv("sweep", tmp_path), *FAULTY])
        logs = "".join(p.read_text() for p in (tmp_path / "sweep").rglob("*.log"))
        assert rc == 1 and "method plug-in 'faulty-plugin'" in logs, (lines, logs)

    def test_report_on_a_full_disk(self, tmp_path, monkeypatch):
        assert _cli(_argv("run", tmp_path))[0] == 0
        from pathlib import Path

        def full(self, *a, **k):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(Path, "write_text", full)
        _one_error(*_cli(["report", str(tmp_path / "run"), "--out", str(tmp_path / "rep")]), 1,
                   "No space left on device")
