"""The results library (``fedblend.results``): display names from the method classes, method diagnostics
registered by the method and shown by ``report --diagnostics``, one run reader for the report and the notebook
API, and every figure drawn by the library."""

from __future__ import annotations

import ast
import json
import textwrap
from pathlib import Path

import pytest

from fedblend.algorithms.registry import METHODS, TRANSFORMS, build_method
from fedblend.cli.main import main
from fedblend.config import load_config
from fedblend.core.diagnostics import Curves, Histogram, RunFiles, diagnostics_of
from fedblend.experiment import run_experiment
from fedblend.results.diagnostics import run_names
from fedblend.results.names import display_name, method_name

pytestmark = pytest.mark.usefixtures("one_thread")

SRC = Path(__file__).resolve().parents[1] / "src" / "fedblend"
TINY = ["dataset='synthetic'", "model='mlp'", "rounds=3", "partition.num_clients=4", "partition.min_samples=5",
        "train.lr=0.05", "log.plot=false", "checkpoint_every=1"]

PLUGIN = '''
from fedblend.algorithms.fedavg import FedAvg
from fedblend.core.diagnostics import Numbers, register_diagnostics


def rounds_seen(run):
    return [Numbers("rounds_seen", {"rows": len(run.metrics), "has_checkpoint": run.has_checkpoint()})]


@register_diagnostics(rounds_seen)
class Named(FedAvg):
    name = "results_plugin_named"
    display_name = "My FedAvg"


class Unnamed(FedAvg):
    name = "results_plugin_unnamed"
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """A plug-in module by path; the methods it registers (``find_plugin``) are gone after the test."""
    from fedblend.algorithms import registry

    (tmp_path / "results_plugin.py").write_text(textwrap.dedent(PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    before = {id(t): dict(t) for t in (registry.METHODS, registry.TRANSFORMS)}
    yield "results_plugin"
    for table in (registry.METHODS, registry.TRANSFORMS):  # the tables other modules hold: emptied in place
        table.clear()
        table.update(before[id(table)])


def _run(tmp: Path, name: str, *extra: str) -> Path:
    run_experiment(load_config(None, [*TINY, *extra]), tmp / name)
    return tmp / name


# ------------------------------------------------------------------------------------------ display names
def test_every_built_in_method_and_transform_names_itself_for_display():
    for name, cls in {**METHODS, **TRANSFORMS}.items():
        if cls.__module__.startswith("fedblend.algorithms."):
            assert "display_name" in vars(cls), f"{name}: no display_name on {cls.__name__}"
    assert method_name("fedprox+ala") == "FedProx+ALA" and method_name("perfedavg") == "Per-FedAvg"
    assert method_name("pfedrlla") == "pFedRLLA" and display_name("fedavg-ft") == "FedAvg-FT"


def test_a_plug_in_shows_its_own_display_name_or_its_class_name(plugin):
    assert method_name(f"{plugin}:Named") == "My FedAvg"
    assert method_name(f"{plugin}:Named+ala") == "My FedAvg+ALA"
    assert method_name(f"{plugin}:Unnamed") == "Unnamed"  # the default: derived from the registry name
    # the plug-in that made an old run is not installed here: the name is still shown, nothing raises
    assert method_name("not_installed_pkg.mod:Gone") == "Gone" and method_name("nosuchmethod") == "nosuchmethod"


# ------------------------------------------------------------------------------------------ diagnostics
def test_diagnostics_are_found_through_the_method_class_and_its_transforms():
    from fedblend.algorithms.ala import learned_weights
    from fedblend.algorithms.fedapa import weight_matrices

    assert diagnostics_of(build_method("fedapa")) == [weight_matrices]
    assert diagnostics_of(build_method("fedala")) == [learned_weights]  # FedALA runs the ALA transform
    assert diagnostics_of(build_method("fedprox+ala")) == [learned_weights]
    assert diagnostics_of(build_method("fedavg")) == []


def test_report_diagnostics_draws_fedapa_and_ala_and_skips_a_run_it_cannot_build(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    runs = tmp_path / "runs"
    apa = _run(runs, "apa", "method='fedapa'", "options.heatmap_rounds=[2]")
    ala = _run(runs, "ala", "method='fedala'")
    broken = runs / "broken"
    broken.mkdir()
    (broken / "metrics.jsonl").write_text('{"round": 1, "acc": 0.5}\n')
    (broken / "config.toml").write_text('method = "not_installed_pkg.mod:Gone"\n')
    assert main(["report", str(runs), "--diagnostics", "--out", str(tmp_path / "rep")]) == 0
    out = capsys.readouterr().out
    assert f"{broken}: skipped (" in out and "cannot be built here" in out
    diag = tmp_path / "rep" / "diagnostics"
    assert sorted(p.name for p in (diag / "apa").glob("*.png")) == ["fedapa_weights_latest.png",
                                                                    "fedapa_weights_round0002.png"]
    numbers = json.loads((diag / "apa" / "diagnostics.json").read_text())
    from fedblend.core.checkpoint import load_checkpoint

    server = load_checkpoint(apa / "checkpoint.pt")["server"]
    latest = build_method("fedapa", {"heatmap_rounds": [2]}).effective_weights(server)
    assert numbers["fedapa_weights_latest"]["mean_self_weight"] == pytest.approx(float(latest.diagonal().mean()))
    assert {"ala_share.png", "ala_epochs.png"} <= {p.name for p in (diag / "ala").glob("*.png")}
    assert any(p.name.startswith("ala_w_rounds_") for p in (diag / "ala").glob("*.png"))
    assert all(p.stat().st_size > 1000 for p in diag.rglob("*.png"))
    assert f"{ala} (FedALA):" in out and f"{apa} (FedAPA):" in out
    assert "no diagnostics registered" not in out


def test_report_diagnostics_names_a_damaged_checkpoint_and_reports_the_other_runs(tmp_path, capsys):
    good = _run(tmp_path / "runs", "good", "method='fedapa'")
    bad = _run(tmp_path / "runs", "bad", "method='fedapa'", "seed=1")
    (bad / "checkpoint.pt").write_bytes((bad / "checkpoint.pt").read_bytes()[:300])
    assert main(["report", str(tmp_path / "runs"), "--diagnostics"]) == 0
    out = capsys.readouterr().out
    assert f"{bad}: skipped ({bad / 'checkpoint.pt'} is not a readable fedblend checkpoint" in out
    shown = out.split(f"{good} (FedAPA):\n", 1)[1].splitlines()
    assert next(x for x in shown if not x.startswith("  fedapa_weights_round")).startswith("  fedapa_weights_latest: {")


def test_report_diagnostics_counts_the_runs_whose_method_registered_none_in_one_line(tmp_path, capsys):
    for i in range(2):
        _run(tmp_path / "runs", f"avg{i}", f"seed={i}")
    assert main(["report", str(tmp_path / "runs"), "--diagnostics"]) == 0
    out = capsys.readouterr().out
    assert out.count("no diagnostics registered") == 1 and "no diagnostics registered: 2 run(s) of FedAvg" in out


def test_ala_diagnostic_reads_the_weights_the_clients_keep_and_the_rounds_metrics(tmp_path):
    run = _run(tmp_path, "ala", "method='fedala'", "rounds=4")
    method = load_config(run / "config.toml").build_method()
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    items = [i for fn in diagnostics_of(method) for i in fn(RunFiles(run, method, rows))]
    hist = [i for i in items if isinstance(i, Histogram)]
    from fedblend.core.checkpoint import load_checkpoint

    kept = [w for st in load_checkpoint(run / "checkpoint.pt")["clients"].values() for w in st["ala"]["weights"].values()]
    assert sum(h.values.numel() for h in hist) == sum(w.numel() for w in kept)
    curves = {i.name: i for i in items if isinstance(i, Curves)}
    epochs = [(m["round"], m["ala_epochs"]) for m in rows if m.get("ala_epochs") is not None]
    assert epochs and curves["ala_epochs"].lines["epochs"] == epochs


def test_a_plug_in_diagnostic_is_shown_by_report(tmp_path, capsys, plugin):
    run = _run(tmp_path, "p", f"method='{plugin}:Named'")
    assert main(["report", str(run), "--diagnostics"]) == 0
    out = capsys.readouterr().out
    assert f"{run} (My FedAvg):" in out
    assert 'rounds_seen: {"rows": 3, "has_checkpoint": true}' in out


def test_fedapa_heatmap_script_draws_the_diagnostic_into_one_folder_and_keeps_only_the_rounds_asked(tmp_path,
                                                                                                    capsys):
    pytest.importorskip("matplotlib")
    from tests.helpers import load_script

    run = _run(tmp_path, "apa", "method='fedapa'", "options.heatmap_rounds=[1,2]")
    assert load_script("fedapa_heatmap").main([str(run), "--out", str(tmp_path / "hm"), "--rounds", "2"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert sorted(p.name for p in (tmp_path / "hm").glob("*.png")) == ["fedapa_weights_latest.png",
                                                                       "fedapa_weights_round0002.png"]
    assert printed[:2] == [str(tmp_path / "hm" / "fedapa_weights_round0002.png"),
                           str(tmp_path / "hm" / "fedapa_weights_latest.png")]
    assert set(json.loads(printed[2])) == {"same_class_mass", "chance_level", "mean_self_weight"}


def test_runs_with_the_same_folder_name_get_distinct_diagnostics_folders(tmp_path):
    a, b = tmp_path / "x" / "seed0", tmp_path / "y" / "seed0"
    assert run_names([a, b]) == ["x__seed0", "y__seed0"]
    assert run_names([a, tmp_path / "z"]) == ["seed0", "z"]


# ------------------------------------------------------------------------------------------ one reader
def test_open_run_and_report_read_metrics_alike_a_line_being_written_is_left_out(tmp_path):
    from fedblend.api import open_run
    from fedblend.common.errors import UserFileError
    from fedblend.results.runs import read_metrics

    (tmp_path / "metrics.jsonl").write_text('{"round": 1, "acc": 0.5}\n{"round": 2, "ac')
    assert open_run(tmp_path).history == read_metrics(tmp_path) == [{"round": 1, "acc": 0.5}]
    (tmp_path / "metrics.jsonl").write_text('{"round": 1, "acc": 0.5}\nnot json\n{"round": 3}\n')
    with pytest.raises(UserFileError, match="line 2 of .*metrics.jsonl is not valid JSON"):
        open_run(tmp_path)


# ------------------------------------------------------------------------------------------ structure
def _calls(path: Path, name: str) -> bool:
    tree = ast.parse(path.read_text())
    return any(isinstance(n, ast.Call) and getattr(n.func, "id", getattr(n.func, "attr", None)) == name
               for n in ast.walk(tree))


def test_every_figure_is_drawn_in_the_results_library():
    """matplotlib is reached only through ``pyplot(...)``; every call of it is in ``fedblend/results``."""
    drawing = sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*.py") if _calls(p, "pyplot"))
    assert drawing and all(p.startswith("results/") for p in drawing), drawing
    importing = [p.relative_to(SRC) for p in SRC.rglob("*.py") for n in ast.walk(ast.parse(p.read_text()))
                 if isinstance(n, (ast.Import, ast.ImportFrom)) and "matplotlib" in ast.unparse(n)]
    assert importing and all(str(p).startswith("results/") for p in importing), importing


def test_the_command_line_imports_no_method_module():
    """``cli/`` reaches methods through the registry only (diagnostics are the methods' own)."""
    bad = []
    for p in (SRC / "cli").rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            mod = node.module if isinstance(node, ast.ImportFrom) else None
            if mod and mod.startswith("fedblend.algorithms.") and mod != "fedblend.algorithms.registry":
                bad.append(f"{p.name}: {mod}")
    assert not bad


def test_group_key_joins_seeds_spelled_before_and_after_the_eval_protocol():
    """A run that spelled the evaluated model as a method option (before ``[eval] model``) shares its row with one
    that spells it the new way, or leaves the default unsaid; another model is another row."""
    from fedblend.results.runs import group_key

    def summary(options: dict, ev: dict) -> dict:
        cfg = {"method": "dbe", "seed": 0, "options": {"kappa": 50.0, **options}, "eval": {"every": 1, **ev}}
        return {"method": "dbe", "run": {"config": cfg}}

    unsaid = group_key(summary({}, {}))
    assert group_key(summary({"eval": "received"}, {})) == unsaid  # the old default, spelled out
    assert group_key(summary({}, {"model": None})) == unsaid
    trained_old = group_key(summary({"eval": "trained"}, {}))
    assert trained_old == group_key(summary({}, {"model": "trained"})) != unsaid
