"""Optional packages (the extras): a missing one never ends a command in a traceback. Work that needs it stops in
one ``fedblend: error:`` line naming the extra (exit 2); where the package only adds a picture (a run's, a
report's or a partition's PNG) the command does the rest and warns. The packages are made missing by
``sys.modules[name] = None`` (``import`` then raises ImportError)."""

from __future__ import annotations

import re
import sys

import pytest

from fedblend.cli.main import main
from fedblend.common.optional import MissingPackageError, require

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ["--set", "dataset=synthetic", "--set", "model=mlp", "--set", "rounds=2", "--set", "partition.num_clients=3",
        "--set", "partition.min_samples=5"]


@pytest.fixture
def no_matplotlib(monkeypatch):
    for name in ("matplotlib", "matplotlib.pyplot"):
        monkeypatch.setitem(sys.modules, name, None)


def test_require_names_what_needs_the_package_and_the_extra_that_installs_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "h5py", None)
    with pytest.raises(MissingPackageError, match=r"^dataset 'usps' needs the h5py package, which is not installed "
                                                  r"\(.*\): pip install 'fedblend\[usps\]'$"):
        require("h5py", "usps", "dataset 'usps'")
    assert require("json", "none", "x") is sys.modules["json"]


def test_a_run_without_matplotlib_writes_its_results_and_warns_that_accuracy_png_is_missing(
        tmp_path, capsys, no_matplotlib):
    assert main(["run", *TINY, "--out", str(tmp_path / "r"), "--quiet"]) == 0
    assert re.search(r"fedblend: warning: no accuracy.png: accuracy.png needs the matplotlib package.*"
                     r"pip install 'fedblend\[plot\]'", capsys.readouterr().err)
    assert (tmp_path / "r" / "summary.json").exists() and not (tmp_path / "r" / "accuracy.png").exists()


def test_report_without_matplotlib_writes_its_tables_and_warns_that_the_figures_are_missing(tmp_path, capsys):
    assert main(["run", *TINY, "--set", "log.plot=false", "--out", str(tmp_path / "runs" / "a"), "--quiet"]) == 0
    with pytest.MonkeyPatch.context() as mp:
        for name in ("matplotlib", "matplotlib.pyplot"):
            mp.setitem(sys.modules, name, None)
        assert main(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "rep")]) == 0
    assert "fedblend: warning: no figures: the report's figures needs the matplotlib package" in capsys.readouterr().err
    written = sorted(p.name for p in (tmp_path / "rep").iterdir())
    assert "table.md" in written and "table.csv" in written and not [n for n in written if n.endswith(".png")]


def test_partition_without_matplotlib_writes_the_partition_and_warns_that_its_png_is_missing(
        tmp_path, capsys, no_matplotlib):
    assert main(["partition", *TINY, "--out", str(tmp_path / "p")]) == 0
    assert (tmp_path / "p" / "partition.json").exists() and not (tmp_path / "p" / "partition.png").exists()
    out, err = capsys.readouterr()
    assert out.strip().endswith("partition.txt") and "fedblend: warning: no partition.png: partition.png needs" in err


def test_a_figure_only_command_without_matplotlib_stops_in_one_line(tmp_path, capsys, no_matplotlib):
    """The heatmaps are the whole product of ``save_heatmap``: a missing matplotlib is its one-line error."""
    import torch

    from fedblend.results.heatmaps import save_heatmap

    with pytest.raises(MissingPackageError, match=r"^the heatmaps needs the matplotlib package.*fedblend\[plot\]'$"):
        save_heatmap(torch.eye(3), tmp_path / "h.png")
    assert not (tmp_path / "h.png").exists()
