"""The benchmark figures in the docs are drawn from the runs committed under results/ (``bookkeeping/figures.py``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fedblend.results.runs import find_runs
from fedblend.results.table import aggregate
from tests.helpers import load_script

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def figures():
    return load_script("figures", "bookkeeping")


def test_every_figure_reads_committed_runs_and_a_doc_shows_it(figures):
    docs = "".join(p.read_text() for p in (REPO / "docs").rglob("*.md"))
    for fig in figures.FIGURES:
        assert fig.image.removeprefix("docs/") in docs, f"{fig.image} is drawn but no doc shows it"
        for row in figures.rows_of(fig):
            assert row["n"] >= 1 and len(row["dirs"]) == row["n"], (fig.image, row["legend"])


def test_a_folders_seeds_make_one_curve_even_when_their_configs_are_named_apart(tmp_path, figures):
    """The T1 seeds of one method were run from configs that differ only in their name; report's grouping keeps
    them apart, a figure's curve averages the whole folder."""
    src = REPO / "results" / "t1" / "dir" / "fedapa"
    folder = tmp_path / "results" / "t1" / "dir" / "fedapa"
    for seed in (0, 1):
        shutil.copytree(src / f"seed{seed}", folder / f"seed{seed}")
    summary = folder / "seed1" / "summary.json"
    data = json.loads(summary.read_text())
    data["label"] = "t1-fmnist-dir-fedavg"
    summary.write_text(json.dumps(data))
    assert len(aggregate(find_runs([folder]))) == 2  # report: two groups

    fig = figures.Figure("docs/img/x.png", (("results/t1/dir/fedapa", "FedAPA"),))
    (row,) = figures.rows_of(fig, tmp_path)
    assert (row["n"], row["seeds"], row["legend"]) == (2, [0, 1], "FedAPA")
    (tmp_path / "docs" / "img").mkdir(parents=True)
    out = figures.draw(fig, tmp_path)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_figure_over_an_empty_folder_is_refused_with_its_name(tmp_path, figures):
    (tmp_path / "results" / "none").mkdir(parents=True)
    fig = figures.Figure("docs/img/x.png", (("results/none", "X"),))
    with pytest.raises(SystemExit, match="results/none holds no finished run"):
        figures.rows_of(fig, tmp_path)
