"""Per-client results and figures a paper can use: every evaluation records each client's counts, the summary
the clients' spread; a run's plot is titled by method and setting; report curves have a legend by method, the
number of seeds and the band's meaning in the title, integer round ticks; ``per_client.png``; ``--compare`` with
fewer than 3 seeds warns; ``scripts/ala_weights.py`` on a short run has no blank panel and integer ticks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedblend.config import load_config
from fedblend.experiment import run_experiment

pytest.importorskip("matplotlib", reason="plots need matplotlib (pip install 'fedblend[plot]')")
pytestmark = pytest.mark.usefixtures("one_thread")

REPO = Path(__file__).resolve().parents[1]
TINY = ["dataset='synthetic'", "model='mlp'", "rounds=3", "partition.num_clients=5", "partition.min_samples=5",
        "train.lr=0.05", "log.plot=false", "checkpoint_every=1"]


def _run(tmp: Path, name: str, *extra: str) -> Path:
    run_experiment(load_config(None, [*TINY, *extra]), tmp / name)
    return tmp / name


def _rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]


def test_every_evaluation_records_each_clients_counts_and_the_summary_their_spread(tmp_path):
    run = _run(tmp_path, "r", "method='fedala'", "eval.clients=4")
    rows = _rows(run)
    for r in rows:
        pc = r["per_client"]
        assert len(pc["clients"]) == 4 and pc["clients"] == sorted(pc["clients"])  # the evaluated subset
        assert r["acc"] == sum(pc["correct"]) / sum(pc["n"]) and all(isinstance(c, int) for c in pc["correct"])
        assert r["global_acc"] == sum(r["global_per_client"]["correct"]) / sum(r["global_per_client"]["n"])
    s = json.loads((run / "summary.json").read_text())
    accs = np.array([c / n for c, n in zip(rows[-1]["per_client"]["correct"], rows[-1]["per_client"]["n"])])
    assert s["final_acc_client_worst"] == accs.min() and s["final_acc_client_p10"] == np.percentile(accs, 10)
    assert s["headline_round"] == s["best_round"]
    head = next(r for r in rows if r["round"] == s["best_round"])["per_client"]
    assert s["headline_acc_client_std"] == pytest.approx(np.std([c / n for c, n in zip(head["correct"], head["n"])]))
    assert "per_client" not in (run / "metrics.csv").read_text().splitlines()[0]  # the CSV keeps scalars only


def test_run_plot_is_titled_by_method_and_setting(tmp_path):
    from fedblend.results.figures import run_figure

    run = _run(tmp_path, "seed0", "method='fedprox+ala'", "partition.alpha=0.3", "seed=4")
    fig = run_figure(run)
    ax = fig.axes[0]
    assert ax.get_title() == "FedProx+ALA\nsynthetic, Dir(0.3), 5 clients, MLP, seed 4"
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["personalized (pooled)", "clients: 10th-90th percentile", "worst client",
                      "global model (pooled)"]
    assert all(float(t).is_integer() for t in ax.get_xticks())


def _fake_sweep(root: Path) -> None:
    """Two FedAPA configs differing in options.mu (3 seeds each) and FedALA with 2 seeds, under file-like labels."""
    for label, method, mu, seeds in (("t1-fmnist-dir-fedapa", "fedapa", 0.5, (0, 1, 2)),
                                     ("t1-fmnist-dir-fedapa-mu0.3", "fedapa", 0.3, (0, 1, 2)),
                                     ("t1-fmnist-dir-fedala", "fedala", None, (0, 1))):
        for seed in seeds:
            d = root / label / f"seed{seed}"
            d.mkdir(parents=True)
            cfg = {"method": method, "dataset": "fmnist", "model": "lenet5", "seed": seed, "name": label,
                   "partition": {"kind": "dirichlet", "alpha": 0.1, "num_clients": 20},
                   "sampling": {"scheme": "fixed", "join_ratio": 1.0}, "options": {"mu": mu} if mu else {}}
            rows = [{"round": r, "acc": 0.5 + 0.1 * r + 0.01 * seed, "loss": 1.0 / r,
                     "per_client": {"clients": [0, 1, 2], "correct": [r, 2 * r, 3], "n": [10, 10, 10]}}
                    for r in (1, 2, 3)]
            (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
            (d / "summary.json").write_text(json.dumps({
                "status": "finished", "label": label, "method": method, "seed": seed, "rounds": 3,
                "best_accuracy": rows[-1]["acc"], "final_accuracy": rows[-1]["acc"], "seconds_per_round": 1.0,
                "final_acc_client_worst": 0.3, "final_acc_client_p10": 0.3, "run": {"config": cfg}}))


def test_report_curves_legend_by_method_with_seeds_setting_and_band_stated(tmp_path):
    from fedblend.results.curves import curves_figure
    from fedblend.results.runs import find_runs
    from fedblend.results.table import aggregate

    _fake_sweep(tmp_path / "runs")
    rows = aggregate(find_runs([tmp_path / "runs"]))
    for band, text in (("std", "band: ± sample std over seeds (ddof = 1)"),
                       ("ci", "band: 95% t-interval of the mean over seeds (only 2 seeds: the interval is very wide)")):
        fig = curves_figure(rows, "acc", band)
        legend = sorted(t.get_text() for t in fig.axes[0].get_legend().get_texts())
        assert legend == ["FedALA (n = 2)", "FedAPA (options.mu=0.3) (n = 3)", "FedAPA (options.mu=0.5) (n = 3)"]
        title = " ".join(fig._suptitle.get_text().split())  # wrapped to the figure's width
        assert max(len(line) for line in fig._suptitle.get_text().splitlines()) <= 14 * fig.get_figwidth()
        assert title.startswith("FMNIST, Dir(0.1), 20 clients, LeNet-5: mean over 2-3 seeds") and text in title, title
        for ax in fig.axes:
            assert ax.get_xlabel() == "round" and all(float(t).is_integer() for t in ax.get_xticks())


def test_report_curves_of_many_rows_put_the_legend_below_the_panels_and_zoom_only_the_accuracy_axis(tmp_path):
    from fedblend.results.curves import LEGEND_INSIDE, curves_figure
    from fedblend.results.runs import find_runs
    from fedblend.results.table import aggregate

    _fake_sweep(tmp_path / "runs")
    (row,) = [r for r in aggregate(find_runs([tmp_path / "runs"])) if r["n"] == 2]
    rows = [dict(row, legend=f"method {i}") for i in range(LEGEND_INSIDE + 2)]
    fig = curves_figure(rows, "acc", acc_range=(60.0, 100.0))
    assert all(ax.get_legend() is None for ax in fig.axes)  # no legend over the curves
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == [f"method {i}" for i in range(LEGEND_INSIDE + 2)]
    fig.canvas.draw()
    box, panels = legend.get_window_extent(), [ax.get_window_extent() for ax in fig.axes]
    assert box.y1 < min(p.y0 for p in panels) and box.y0 >= 0  # under both panels, inside the figure
    acc, loss = fig.axes
    assert acc.get_ylim() == (60.0, 100.0) and acc.get_ylabel().endswith("(zoomed)")
    assert loss.get_ylim()[1] < 1.5 and not loss.get_ylabel().endswith("(zoomed)")


def test_report_global_curves_count_only_the_rows_that_have_a_global_model(tmp_path):
    from fedblend.results.curves import curves_figure
    from fedblend.results.runs import find_runs
    from fedblend.results.table import aggregate

    _fake_sweep(tmp_path / "runs")
    for metrics in (tmp_path / "runs" / "t1-fmnist-dir-fedala").rglob("metrics.jsonl"):  # 2 seeds; FedAPA 3, no w
        rows = [json.loads(x) for x in metrics.read_text().splitlines()]
        metrics.write_text("".join(json.dumps({**r, "global_acc": 0.4, "global_loss": 1.0}) + "\n" for r in rows))
    fig = curves_figure(aggregate(find_runs([tmp_path / "runs"])), "global_acc")
    title = " ".join(fig._suptitle.get_text().split())
    assert "mean over 2 seeds;" in title, title
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["FedALA"]


def test_report_curves_of_one_seed_per_row_say_so_once_and_name_no_band(tmp_path):
    import shutil

    from fedblend.results.curves import curves_figure
    from fedblend.results.runs import find_runs
    from fedblend.results.table import aggregate

    _fake_sweep(tmp_path / "runs")
    for extra in (tmp_path / "runs").glob("*/seed[12]"):
        shutil.rmtree(extra)
    rows = aggregate(find_runs([tmp_path / "runs"]))
    assert {r["n"] for r in rows} == {1}
    title = " ".join(curves_figure(rows, "acc")._suptitle.get_text().split())
    assert title == "FMNIST, Dir(0.1), 20 clients, LeNet-5: one seed per curve, no band", title


def test_report_curves_of_more_rows_than_colours_keep_every_line_distinct(tmp_path):
    from fedblend.results.curves import curves_figure
    from fedblend.results.runs import find_runs
    from fedblend.results.table import aggregate

    _fake_sweep(tmp_path / "runs")
    (row,) = [r for r in aggregate(find_runs([tmp_path / "runs"])) if r["n"] == 2]
    rows = [dict(row, legend=f"method {i}") for i in range(13)]
    for axis in curves_figure(rows, "acc").axes:
        looks = [(line.get_color(), line.get_linestyle()) for line in axis.get_lines()]
        assert len(looks) == 13 and len(set(looks)) == 13, looks


def test_report_curves_give_a_row_with_a_slot_that_slots_colour_and_style_in_every_figure(tmp_path):
    from fedblend.results.curves import LINE_STYLES, curves_figure
    from fedblend.results.runs import find_runs
    from fedblend.results.table import aggregate

    _fake_sweep(tmp_path / "runs")
    (row,) = [r for r in aggregate(find_runs([tmp_path / "runs"])) if r["n"] == 2]
    full = [dict(row, legend=f"method {i}", slot=i) for i in range(12)]
    part = [full[11], full[3]]  # another figure with two of the rows, in another order
    for rows in (full, part):
        for axis in curves_figure(rows, "acc").axes:
            looks = {line.get_label(): (line.get_color(), line.get_linestyle()) for line in axis.get_lines()}
            assert looks["method 3"] == ("C3", "-") and looks["method 11"] == ("C1", LINE_STYLES[1]), looks
    unslotted = [dict(r) for r in part]
    for r in unslotted:
        del r["slot"]
    colours = [line.get_color() for line in curves_figure(unslotted, "acc").axes[0].get_lines()]
    assert colours == ["C0", "C1"]  # without a slot, the row's place in the figure


def test_legends_show_an_empty_config_value_and_per_client_labels_fit_their_box(tmp_path, monkeypatch):
    import matplotlib.axes

    from fedblend.results.figures import plot_client_distribution
    from fedblend.results.table import legend_labels

    rows = [{"method": "pfedrlla", "label": f"r{i}", "_config": {"method": "pfedrlla", "options": {"agent": a}}}
            for i, a in enumerate(("", "agents/t4-fmnist-pat4.pt"))]
    labels = legend_labels(rows)
    assert labels == ['pFedRLLA (options.agent="")', "pFedRLLA (options.agent=agents/t4-fmnist-pat4.pt)"]
    shown, real = [], matplotlib.axes.Axes.set_xticklabels
    monkeypatch.setattr(matplotlib.axes.Axes, "set_xticklabels",
                        lambda self, texts, **k: shown.extend(texts) or real(self, texts, **k))
    plot_client_distribution([(name, [0.9, 0.8], 1) for name in labels], tmp_path / "pc.png", "setting")
    names = [t.splitlines()[:-1] for t in shown]  # the last line counts the clients
    assert len(names) == 2 and all(len(line) <= 22 for name in names for line in name), shown
    assert " ".join(names[0]) == labels[0] and "".join(names[1]).replace(" ", "") == labels[1].replace(" ", "")


def test_report_cli_acc_range_zooms_the_written_curves_and_refuses_a_reversed_or_out_of_range_pair(
        tmp_path, capsys, monkeypatch):
    import fedblend.results.curves as rep
    from fedblend.cli.main import main

    drawn, real = [], rep.curves_figure
    monkeypatch.setattr(rep, "curves_figure", lambda *a, **k: drawn.append(real(*a, **k)) or drawn[-1])
    _fake_sweep(tmp_path / "runs")
    assert main(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "rep"), "--acc-range", "95", "100"]) == 0
    assert (tmp_path / "rep" / "accuracy.png").stat().st_size > 5000
    assert drawn and all(fig.axes[0].get_ylim() == (95.0, 100.0) for fig in drawn)
    capsys.readouterr()
    for bad in (("100", "95"), ("-5", "100"), ("90", "101")):
        assert main(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "bad"), "--acc-range", *bad]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("fedblend: error: ") and "--acc-range" in err[0], err
        assert "must be" in err[0] and ("0 <= LOW < HIGH" in err[0] or "[0, 100]" in err[0]), err
        assert not (tmp_path / "bad").exists()


def test_report_writes_the_per_client_distribution_and_fairness_columns(tmp_path):
    from fedblend.results.report import report

    _fake_sweep(tmp_path / "runs")
    table = report([tmp_path / "runs"], tmp_path / "rep", plots=True)
    assert "| worst client % | client p10 % |" in table and "30.00 ± 0.00" in table
    assert (tmp_path / "rep" / "per_client.png").stat().st_size > 5000
    from fedblend.results.figures import final_client_accuracies

    assert final_client_accuracies([tmp_path / "runs" / "t1-fmnist-dir-fedala" / "seed0"]) == [0.3, 0.6, 0.3]


def test_report_table_names_the_method_of_runs_that_share_a_config_name(tmp_path):
    """Runs of one config file with ``--set method=X`` keep the file's name: the table must still say which
    method each row is, and the warning must say how to tell the rows apart."""
    from fedblend.results.report import report

    root = tmp_path / "runs"
    for method in ("fedphp", "fedgh"):
        d = root / method / "seed0"
        d.mkdir(parents=True)
        cfg = {"method": method, "dataset": "fmnist", "seed": 0, "name": "t1-fmnist-dir-fedavg"}
        (d / "metrics.jsonl").write_text(json.dumps({"round": 1, "acc": 0.9, "loss": 0.3}) + "\n")
        (d / "summary.json").write_text(json.dumps({
            "status": "finished", "label": "t1-fmnist-dir-fedavg", "method": method, "seed": 0, "rounds": 1,
            "best_accuracy": 0.9, "final_accuracy": 0.9, "seconds_per_round": 1.0, "run": {"config": cfg}}))
    table = report([root], None, plots=False)
    body = [line for line in table.splitlines() if line.startswith("| t1-fmnist-dir-fedavg |")]
    assert table.startswith("| run | method | config |")
    assert sorted(line.split(" | ")[1] for line in body) == ["fedgh", "fedphp"]
    assert "see the method and config columns" in table


def test_report_rounds_to_target_counts_the_seeds_that_reached_it_and_appears_only_with_a_target(tmp_path):
    """``eval.target``'s rounds to target (pFedRLLA's convergence claim): mean ± std over the seeds that reached
    it, how many did, the target itself; a table whose runs set no target has no such column, in every format."""
    from fedblend.results.report import report

    root = tmp_path / "runs"
    for label, hits in (("fast", (20, 40, None)), ("never", (None, None)), ("plain", ())):
        for seed, hit in enumerate(hits or (None,)):
            d = root / label / f"seed{seed}"
            d.mkdir(parents=True)
            (d / "metrics.jsonl").write_text(json.dumps({"round": 1, "acc": 0.9, "loss": 0.3}) + "\n")
            target = {"target_accuracy": 0.85, "rounds_to_target": hit} if hits else {}
            (d / "summary.json").write_text(json.dumps({
                "status": "finished", "label": label, "method": "fedavg", "seed": seed, "rounds": 50,
                "best_accuracy": 0.9, "final_accuracy": 0.9, "seconds_per_round": 1.0, **target,
                "run": {"config": {"method": "fedavg", "name": label, "seed": seed}}}))
    table = report([root], tmp_path / "rep", plots=False)
    assert "| client p10 % | rounds to target | s/round |" in table
    cells = {line.split(" | ")[0][2:]: line.split(" | ")[-2] for line in table.splitlines()[2:] if line}
    assert cells == {"fast": "30.0 ± 14.1 to 85% (2 of 3 seeds)", "never": "not reached (85%)", "plain": "-"}
    assert "rounds to target" in (tmp_path / "rep" / "table.csv").read_text().splitlines()[0]
    assert "rounds to target" in (tmp_path / "rep" / "table.tex").read_text()
    plain = report([root / "plain"], None, plots=False)
    assert "rounds to target" not in plain and "| client p10 % | s/round |" in plain


def test_compare_with_fewer_than_three_seeds_warns_that_the_interval_means_little(tmp_path, capsys):
    from fedblend.cli.main import main

    _fake_sweep(tmp_path / "runs")
    assert main(["report", str(tmp_path / "runs"), "--no-plots", "--compare", "fedala",
                 "t1-fmnist-dir-fedapa-mu0.3"]) == 0
    out, err = capsys.readouterr()
    assert "warning: only 2 paired seeds: the 95% interval uses t = 12.7 with 1 degree(s) of freedom" in out
    assert err.startswith("fedblend: warning: --compare fedala t1-fmnist-dir-fedapa-mu0.3: only 2 paired seeds")
    assert main(["report", str(tmp_path / "runs"), "--no-plots", "--compare", "t1-fmnist-dir-fedapa-mu0.3",
                 "t1-fmnist-dir-fedapa@" + _hash(tmp_path, "t1-fmnist-dir-fedapa")]) == 0
    out, err = capsys.readouterr()
    assert "warning" not in out + err  # three paired seeds


def _hash(tmp: Path, label: str) -> str:
    from fedblend.results.runs import find_runs
    from fedblend.results.table import aggregate

    return next(r["config_hash"] for r in aggregate(find_runs([tmp / "runs"])) if r["label"] == label)


def test_ala_weights_script_on_a_short_run_has_no_blank_panel_and_integer_ticks(tmp_path):
    """Two rounds of FedALA: every panel draws something or says why it cannot, every round axis has whole-number
    ticks over the same rounds."""
    run = _run(tmp_path, "ala", "method='fedala'", "rounds=2")
    probe = tmp_path / "probe.py"
    probe.write_text(f"""
import json, runpy, sys
import matplotlib
matplotlib.use("Agg")
from matplotlib.figure import Figure
seen = []
Figure.savefig = lambda self, *a, **k: seen.append(self)
sys.argv = ["ala_weights.py", {str(run)!r}]
try:
    runpy.run_path({str(REPO / "scripts" / "ala_weights.py")!r}, run_name="__main__")
except SystemExit:
    pass
out = []
for ax in seen[0].axes:
    out.append({{"xlabel": ax.get_xlabel(), "xticks": [float(t) for t in ax.get_xticks()], "xlim": list(ax.get_xlim()),
                "drawn": len(ax.lines) + len(ax.patches) + len(ax.collections) + len(ax.texts)}})
print(json.dumps(out))
""")
    res = subprocess.run([sys.executable, str(probe)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    axes = json.loads(res.stdout.strip().splitlines()[-1])
    assert len(axes) == 4 and all(a["drawn"] > 0 for a in axes), axes
    rounds = [a for a in axes if a["xlabel"] == "round"]
    assert len(rounds) == 3 and all(a["xlim"] == [0.5, 2.5] for a in rounds)
    assert all(float(t).is_integer() for a in rounds for t in a["xticks"])
