"""A run's identity records the code of every plug-in it used, and ``--resume`` refuses a plug-in whose code
changed since the run started.

A one-file plug-in method (a FedAvg subclass) in a temporary folder on ``sys.path``, named by
``"module:Class"``: the summary's identity records its source file and sha256; a run of 1 round, then the file
edited: ``--resume`` is refused in one line naming the plug-in (exit 2), ``--allow-code-change`` continues with a
warning and records the start's code; the file unchanged: it resumes.
"""

from __future__ import annotations

import hashlib
import json
import sys

import pytest

from fedblend.cli.main import main

pytestmark = pytest.mark.usefixtures("one_thread")

PLUGIN = '''"""A plug-in method for the test: FedAvg under another name."""
from fedblend.algorithms.fedavg import FedAvg


class Plug(FedAvg):
    name = "plug"
'''
SETS = ["dataset='synthetic'", "model='mlp'", "rounds=2", "seed=1", "checkpoint_every=1",
        "partition.num_clients=3", "partition.min_samples=5", "train.lr=0.05", "log.plot=false"]


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """The plug-in module's file, importable as ``fb_plug_<n>`` (a fresh name per test), and its registration
    removed afterwards."""
    from fedblend.algorithms.registry import METHODS

    name = f"fb_plug_{tmp_path.name.replace('-', '_')}"
    path = tmp_path / "site" / f"{name}.py"
    path.parent.mkdir()
    path.write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(path.parent))
    saved = dict(METHODS)
    yield path, f"{name}:Plug"
    METHODS.clear()
    METHODS.update(saved)
    sys.modules.pop(name, None)


def _args(spec: str, out) -> list[str]:
    return ["run", "--set", f"method={spec!r}", *[a for s in SETS for a in ("--set", s)], "--quiet", "--threads",
            "1", "--out", str(out)]


def test_the_identity_records_the_plugin_code_and_a_changed_plugin_is_refused(plugin, tmp_path, capsys):
    path, spec = plugin
    out = tmp_path / "run"
    assert main([*_args(spec, out), "--set", "rounds=1"]) == 0
    capsys.readouterr()
    rec = json.loads((out / "summary.json").read_text())["run"]["plugins"][f"method {spec}"]
    assert rec["file"] == str(path.resolve()) and rec["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    path.write_text(PLUGIN.replace("FedAvg under another name", "edited after the run started"))
    assert main([*_args(spec, out), "--resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fedblend: error: --resume"), err
    assert f"plug-in method {spec}" in err[0] and "code changed since the run started" in err[0], err
    assert "--allow-code-change" in err[0]
    assert main([*_args(spec, out), "--resume", "--allow-code-change"]) == 0
    assert "warning: --allow-code-change: plug-in method" in capsys.readouterr().err
    run = json.loads((out / "summary.json").read_text())["run"]
    assert run["plugins_at_start"][f"method {spec}"]["sha256"] == rec["sha256"]
    assert run["plugins"][f"method {spec}"]["sha256"] != rec["sha256"]


def test_an_unchanged_plugin_resumes(plugin, tmp_path, capsys):
    _, spec = plugin
    out = tmp_path / "run"
    assert main([*_args(spec, out), "--set", "rounds=1"]) == 0
    assert main([*_args(spec, out), "--resume"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == 2 and f"method {spec}" in summary["run"]["plugins"]


def test_allow_code_change_without_resume_is_refused(plugin, tmp_path, capsys):
    _, spec = plugin
    assert main([*_args(spec, tmp_path / "run"), "--allow-code-change"]) == 2
    assert "--allow-code-change applies to --resume only" in capsys.readouterr().err
