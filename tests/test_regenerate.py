"""``python bookkeeping/regenerate.py``: the one command for every file generated from the registered methods
(docs blocks and the README's methods table, bundled method configs, missing synthetic goldens). It finds a
missing config and missing goldens, writes exactly those, and leaves every golden already recorded as it was."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fedblend.common.histories import diff_histories
from tests.helpers import load_script

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def regen(tmp_path, monkeypatch):
    """The script, writing a scratch copy of the configs and goldens: ``local``'s config and goldens removed."""
    mod = load_script("regenerate", "bookkeeping")
    configs, golden = tmp_path / "configs", tmp_path / "synthetic.json"
    shutil.copytree(mod.CONFIGS, configs)
    (configs / "local.toml").unlink()
    want = json.loads(mod.GOLDEN.read_text())
    golden.write_text(json.dumps({k: v for k, v in want.items() if not k.startswith("local/")}))
    monkeypatch.setattr(mod, "CONFIGS", configs)
    monkeypatch.setattr(mod, "GOLDEN", golden)
    monkeypatch.setattr(mod, "ROOT", tmp_path.parent)  # the paths it names, relative to this folder
    return mod, want


def test_check_names_the_missing_config_and_goldens_and_writes_nothing(regen, capsys):
    mod, _ = regen
    assert mod.main(["--check"]) == 1
    err = capsys.readouterr().err
    assert "configs/local.toml is stale: run python bookkeeping/regenerate.py" in err
    assert "synthetic.json (no history for local/full, local/partial-keep)" in err
    assert not (mod.CONFIGS / "local.toml").exists()


def test_it_writes_the_missing_files_and_never_rewrites_a_golden(regen, capsys):
    mod, want = regen
    before = json.loads(mod.GOLDEN.read_text())
    assert mod.main([]) == 0
    got = json.loads(mod.GOLDEN.read_text())
    assert set(got) == set(want)
    assert {k: v for k, v in got.items() if k in before} == before  # every golden kept as recorded
    for key in ("local/full", "local/partial-keep"):  # the new ones: what the committed goldens hold
        assert diff_histories(want[key], got[key]) == []
    assert (mod.CONFIGS / "local.toml").read_text() == (REPO / "configs" / "methods" / "local.toml").read_text()
    assert mod.main(["--check"]) == 0
