"""The benchmark tables in the docs are generated from the runs committed under results/ (``bookkeeping/tables.py``):
a number in a generated block that results/ does not give fails here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import load_script

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tables():
    return load_script("tables", "bookkeeping")


def _run(root: Path, rel: str, seed: int, **summary) -> Path:
    d = root / rel / f"seed{seed}"
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({"status": "finished", "seed": seed, **summary}))
    (d / "config.toml").write_text(f"seed = {seed}\n")
    (d / "metrics.jsonl").write_text("")
    return d


def test_docs_tables_match_the_committed_results(tables):
    assert tables.check() == []


def test_every_doc_names_only_known_tables(tables):
    for path in tables.docs():
        for m in tables.BLOCK.finditer(path.read_text()):
            assert m.group("name") in tables.RENDERERS, f"{path}: {m.group('name')}"


def test_cell_is_mean_and_sample_std_over_seeds_with_the_paper_in_brackets(tmp_path, tables):
    for seed, acc in enumerate([0.99, 0.98, 0.97]):
        _run(tmp_path, "results/t3/pat/ditto", seed, method="ditto", best_accuracy=acc)
    _run(tmp_path, "results/t3/pat/fedrep", 0, method="fedrep", best_accuracy=0.995)
    _run(tmp_path, "results/t3/pat/fedrep", 1, method="fedrep", best_accuracy=0.5, status="stopped")
    text = tables.render(tables.T3, tmp_path)
    assert "| Ditto | 98.00 ± 1.00 [99.81] |" in text  # std with ddof = 1: sqrt(((1)^2 + 0 + (1)^2) / 2) = 1
    assert "| FedRep | 99.50 (1 seed) [99.77] |" in text  # the stopped run is not averaged
    assert "| FedALA | not run [99.88] |" in text


def test_global_model_rows_report_the_global_metric(tmp_path, tables):
    """T3's FedAvg row is the global model of the FedAvg-FT runs (they train exactly like FedAvg), as T1's."""
    _run(tmp_path, "results/t3/pat/fedavg-ft", 0, method="fedavg-ft", best_accuracy=0.9, global_best_accuracy=0.8)
    text = tables.render(tables.T3, tmp_path)
    assert "| FedAvg (global model) | 80.00 (1 seed) [97.93] |" in text
    assert "| FedAvg-C (FedAvg-FT, 1 epoch fine-tuning) | 90.00 (1 seed) [99.79] |" in text


def test_ala_gain_is_paired_by_seed(tmp_path, tables):
    for seed, (a, b) in enumerate([(0.90, 0.95), (0.80, 0.86)]):
        _run(tmp_path, "results/ala/dir/ditto", seed, method="ditto", best_accuracy=a)
        _run(tmp_path, "results/ala/dir/ditto+ala", seed, method="ditto+ala", best_accuracy=b)
    _run(tmp_path, "results/ala/dir/ditto+ala", 7, method="ditto+ala", best_accuracy=0.1)  # no partner: left out
    line = next(x for x in tables.render(tables.ALA, tmp_path).splitlines() if x.startswith("| ditto+ala |"))
    # mean 5.50, sem 0.50, t(0.975, 1 dof) = 12.706: the interval is 5.50 -/+ 6.35
    assert line.endswith("| +5.50 [-0.85, +11.85] (2 seeds; per seed +5.00 / +6.00) |")
    _run(tmp_path, "results/ala/dir/pfedme", 0, method="pfedme", best_accuracy=0.9)
    _run(tmp_path, "results/ala/dir/pfedme+ala", 0, method="pfedme+ala", best_accuracy=0.8)
    line = next(x for x in tables.render(tables.ALA, tmp_path).splitlines() if x.startswith("| pfedme+ala |"))
    assert line.endswith("| -10.00 |")  # one seed: no interval



def test_ala_rows_that_are_t1_runs_read_results_t1(tmp_path, tables):
    """FedPHP as an ALA host is T1's FedPHP row (same config): its cell and the gain come from results/t1, and a
    run under results/ala for it is not read; fedavg+ala is T1's FedALA, FedAvg the FedAvg-FT runs' global model."""
    _run(tmp_path, "results/t1/dir/fedphp", 0, method="fedphp", best_accuracy=0.90)
    _run(tmp_path, "results/ala/dir/fedphp", 0, method="fedphp", best_accuracy=0.10)
    _run(tmp_path, "results/ala/dir/fedphp+ala", 0, method="fedphp+ala", best_accuracy=0.93)
    _run(tmp_path, "results/t1/dir/fedavg-ft", 0, method="fedavg-ft", best_accuracy=0.97, global_best_accuracy=0.85)
    _run(tmp_path, "results/t1/dir/fedala", 0, method="fedala", best_accuracy=0.96)
    lines = tables.render(tables.ALA, tmp_path).splitlines()
    assert "| fedphp (T1's fedphp runs) | 90.00 (1 seed) |  |" in lines
    assert "| fedphp+ala | 93.00 (1 seed) | +3.00 |" in lines
    assert "| fedavg (T1's fedavg-ft runs) | 85.00 (1 seed) |  |" in lines
    assert "| fedavg+ala (T1's fedala runs) | 96.00 (1 seed) | +11.00 |" in lines

def test_a_stale_number_in_a_doc_is_caught_and_regenerated(tmp_path, tables):
    for seed, acc in enumerate([0.99, 0.98, 0.97]):
        _run(tmp_path, "results/t3/pat/ditto", seed, method="ditto", best_accuracy=acc)
    fresh = tables.render(tables.T3, tmp_path)
    doc = tmp_path / "docs" / "benchmarks.md"
    doc.parent.mkdir()
    doc.write_text("# T3\n<!-- table:t3 -->\n" + fresh.replace("98.00 ± 1.00", "98.10 ± 1.00") + "\n<!-- /table:t3 -->\n")
    assert tables.check(tmp_path) == ["docs/benchmarks.md: t3"]
    new, changed = tables.regenerate(doc.read_text(), tmp_path)
    doc.write_text(new)
    assert changed == ["t3"] and tables.check(tmp_path) == [] and "98.00 ± 1.00" in new


def test_validation_row_compares_round_by_round(tmp_path, tables):
    folder = tmp_path / "results" / "validation" / "fedavg"
    (folder / "fedblend").mkdir(parents=True)
    rows = [{"round": r, "acc": a} for r, a in [(1, 0.50), (2, 0.70), (3, 0.80)]]
    (folder / "fedblend" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "reference.json").write_text(json.dumps({"repository": "TsingZ0/PFLlib", "commit": "abcdef0123456789",
                                                       "rounds": [1, 2, 3], "acc": [0.52, 0.66, 0.805]}))
    (folder / "verdict.md").write_text("agrees\n")
    (row,) = tables.validation_rows(tmp_path)
    assert row["max_diff"] == pytest.approx(4.0) and row["max_round"] == 2 and row["last"] == 3
    assert (row["ours"], row["theirs"]) == (pytest.approx(80.0), pytest.approx(80.5))
    assert ("| fedavg | TsingZ0/PFLlib @ abcdef0123 | 3 | +4.00 (round 2) | 80.00 / 80.50 (-0.50) | - | - | - "
            "| agrees |") in tables.render_validation(tmp_path)
    # fedblend from the reference's initial weights: its own column, compared round by round as well
    (folder / "fedblend-pflib-init").mkdir()
    same = [{"round": r, "acc": a} for r, a in [(1, 0.53), (2, 0.64), (3, 0.81)]]
    (folder / "fedblend-pflib-init" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in same))
    assert "| 80.00 / 80.50 (-0.50) | - | -2.00 (round 2); 81.00 | - | agrees |" in tables.render_validation(tmp_path)
    # the reference's options from fedblend's own initial weights: the same column, marked so
    (folder / "fedblend-reference-options").mkdir()
    own = [{"round": r, "acc": a} for r, a in [(1, 0.49), (2, 0.66), (3, 0.79)]]
    (folder / "fedblend-reference-options" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in own))
    assert ("| -2.00 (round 2); 81.00 | -3.00 (round 1); -1.50; 79.00 (own initial weights) | agrees |"
            in tables.render_validation(tmp_path))
    # and with the options that reproduce the reference's behaviour and its initial weights: that run is shown
    (folder / "fedblend-as-reference").mkdir()
    asref = [{"round": r, "acc": a} for r, a in [(1, 0.52), (2, 0.67), (3, 0.80)]]
    (folder / "fedblend-as-reference" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in asref))
    assert "| -2.00 (round 2); 81.00 | +1.00 (round 2); +0.17; 80.00 | agrees |" in tables.render_validation(tmp_path)


def test_collect_copies_only_the_run_files_of_finished_runs(tmp_path, tables):
    sweep = tmp_path / "sweep"
    done = _run(sweep, "t3-x__method=ditto", 0, method="ditto", best_accuracy=0.9)
    (done / "checkpoint.pt").write_bytes(b"x")
    _run(sweep, "t3-x__method=fedrep", 0, method="fedrep", best_accuracy=0.9, status="stopped")
    copied = tables.collect(sweep, tmp_path / "results" / "t3" / "pat")
    assert copied == [tmp_path / "results" / "t3" / "pat" / "ditto" / "seed0"]
    assert sorted(p.name for p in copied[0].iterdir()) == ["config.toml", "metrics.jsonl", "summary.json"]


def test_a_diverged_run_is_named_in_its_cell_and_never_averaged(tmp_path, tables):
    _run(tmp_path, "results/t3/pat/ditto", 0, method="ditto", best_accuracy=0.99)
    _run(tmp_path, "results/t3/pat/ditto", 1, method="ditto", best_accuracy=0.2, rounds=4, status="diverged",
         divergence={"round": 5, "reason": "loss"})
    _run(tmp_path, "results/t3/pat/fedrep", 0, method="fedrep", best_accuracy=0.8, rounds=2, status="diverged",
         divergence={"round": 3, "reason": "NaN"})
    text = tables.render(tables.T3, tmp_path)
    assert "| Ditto | 99.00 (1 seed); diverged: seed 1 (round 5) [99.81] |" in text
    assert "| FedRep | diverged: seed 0 (round 3) [99.77] |" in text


def test_collect_keeps_diverged_runs_and_drops_unfinished_ones(tmp_path, tables):
    sweep = tmp_path / "sweep"
    _run(sweep, "a", 0, method="apple", best_accuracy=0.8, rounds=2, status="diverged")
    _run(sweep, "b", 0, method="dbe", best_accuracy=0.5, status="running")
    copied = tables.collect(sweep, tmp_path / "results" / "t1" / "dir")
    assert copied == [tmp_path / "results" / "t1" / "dir" / "apple" / "seed0"]


def test_t4_rounds_to_target_counts_the_seeds_that_never_reached_it(tmp_path, tables):
    for seed, hit in enumerate([40, 60, None]):
        _run(tmp_path, "results/t4/fmnist-pat2/pfedrlla", seed, method="pfedrlla", best_accuracy=0.9,
             rounds_to_target=hit)
    _run(tmp_path, "results/t4/fmnist-pat2/local", 0, method="local", best_accuracy=0.8, rounds_to_target=None)
    rounds = tables.render(tables.T4_ROUNDS, tmp_path)
    assert ("| pFedRLLA (agent not pre-trained) | 50.0 ± 14.1 (2 seeds); target not reached: 1 of 3 seeds "
            "| not run | not run |") in rounds
    assert "| Local-only | target not reached | not run | not run |" in rounds
    assert "| pFedRLLA (agent not pre-trained) | 90.00 ± 0.00 | not run | not run |" in tables.render(tables.T4, tmp_path)


def test_collect_files_two_rows_of_one_method_apart(tmp_path, tables):
    for name in ("a", "b"):
        d = tmp_path / "sweep" / name
        d.mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps({"status": "finished", "method": "pfedrlla", "seed": 0}))
        (d / "config.toml").write_text("")
        (d / "metrics.jsonl").write_text("")
    tables.collect(tmp_path / "sweep" / "a", tmp_path / "out")
    tables.collect(tmp_path / "sweep" / "b", tmp_path / "out", row="pfedrlla-pretrained")
    assert sorted(p.relative_to(tmp_path / "out").as_posix() for p in (tmp_path / "out").glob("*/seed0")) == \
        ["pfedrlla-pretrained/seed0", "pfedrlla/seed0"]


def test_t1_rows_against_fedapa_are_paired_by_seed_with_a_t_interval(tmp_path, tables):
    for seed, acc in enumerate([0.90, 0.92, 0.99]):
        _run(tmp_path, "results/t1/pat/fedphp", seed, method="fedphp", best_accuracy=acc)
    for seed, acc in enumerate([0.89, 0.90]):
        _run(tmp_path, "results/t1/pat/fedapa", seed, method="fedapa", best_accuracy=acc)
    _run(tmp_path, "results/t1/dir/fedamp", 4, method="fedamp", best_accuracy=0.9)
    text = tables.render_paired(tables.T1, "fedapa", tmp_path)
    # seeds 0 and 1 pair: differences +1 and +2 points; t(0.975, 1) = 12.706, half width 12.706 * 0.7071 / sqrt(2)
    assert "| FedPHP | +1.50 [-4.85, +7.85] (2 seeds) | - |" in text
    assert "| FedAMP | - | - |" in text  # no FedAPA run of its seed
    assert "FedAPA |" not in text.split("\n", 2)[2]  # the anchor has no row of its own
    text = tables.render_paired(tables.T1, "fedapa", tmp_path, per_seed=True)  # T4's: each seed's difference too
    assert "| FedPHP | +1.50 [-4.85, +7.85] (2 seeds; per seed +1.00 / +2.00) | - |" in text


def test_a_method_without_a_reference_gets_a_row_saying_so(tmp_path, tables):
    folder = tmp_path / "results" / "validation" / "partialfed"
    folder.mkdir(parents=True)
    (folder / "reference.json").write_text(json.dumps({"status": "no public reference", "searched": ["x"]}))
    (folder / "verdict.md").write_text("**no public reference.** Searched x;\n evidence: tests.\n")
    lines = tables.render_validation(tmp_path).splitlines()
    assert lines[2:] == ["| partialfed | no public reference | - | - | - | - | - | - | "
                         "**no public reference.** Searched x; evidence: tests. |"]
    assert lines[0].count("|") == lines[2].count("|")  # as many cells as the header


def test_t4_verdict_is_the_best_pfedrlla_row_against_the_best_other_paired_by_seed(tmp_path, tables):
    """Issue #25's verdict per column: the pre-trained row (mean 0.92) beats the plain one (0.90); the best other
    row is FedAvg-FT (0.91) over Local (0.89); the difference is paired over the seeds both have. Rounds to the
    target are paired over the seeds where both reached it: seed 2 of FedAvg-FT never did, so only seeds 0 and 1
    (-10 and 0 rounds) count."""
    col = "results/t4/fmnist-pat2"
    rows = [(0.93, 0.90, 0.91, 0.89, 20, 30), (0.91, 0.90, 0.91, 0.89, 30, 30), (0.92, 0.90, 0.91, 0.89, 40, None)]
    for seed, (pre, plain, ft, local, pre_hit, ft_hit) in enumerate(rows):
        _run(tmp_path, f"{col}/pfedrlla-pretrained", seed, method="pfedrlla", best_accuracy=pre,
             rounds_to_target=pre_hit)
        _run(tmp_path, f"{col}/pfedrlla", seed, method="pfedrlla", best_accuracy=plain)
        _run(tmp_path, f"{col}/fedavg-ft", seed, method="fedavg-ft", best_accuracy=ft, rounds_to_target=ft_hit)
        _run(tmp_path, f"{col}/local", seed, method="local", best_accuracy=local)
    lines = tables.render_verdict(tables.T4, ("pfedrlla", "pfedrlla-pretrained"), tmp_path).splitlines()
    row = next(x for x in lines if x.startswith("| FMNIST pathological s = 2 |"))
    assert row.startswith("| FMNIST pathological s = 2 | pFedRLLA (pre-trained agent): 92.00 (3 seeds) | "
                          "FedAvg-FT: 91.00 (3 seeds) | +1.00 [")  # +2, 0, +1 per seed: mean +1
    # -10 and 0 rounds: mean -5, t(0.975, 1) = 12.706 times the standard error 5
    assert row.endswith("| -5.0 [-68.5, +58.5] (2 seeds) |")
    assert lines[2].count("|") == lines[0].count("|")  # as many cells as the header
    assert "| MNIST* | not run | not run | - | - |" in lines


def test_t4_transfer_row_applies_only_to_mnist_star_and_counts_in_its_verdict(tmp_path, tables):
    """The FMNIST-pre-trained agent run on MNIST* (App. F.2's new scenario) is a row of the MNIST* column only: "n/a"
    in the FMNIST columns (there it is the pre-trained row), and the verdict weighs it as a pFedRLLA row."""
    col = "results/t4/mnist-domains"
    for seed, (transfer, local) in enumerate([(0.95, 0.93), (0.96, 0.92)]):
        _run(tmp_path, f"{col}/pfedrlla-transfer", seed, method="pfedrlla", best_accuracy=transfer)
        _run(tmp_path, f"{col}/local", seed, method="local", best_accuracy=local)
    _run(tmp_path, "results/t4/fmnist-pat2/pfedrlla-transfer", 0, method="pfedrlla", best_accuracy=0.5)  # not read
    row = next(x for x in tables.render(tables.T4, tmp_path).splitlines() if x.startswith("| pFedRLLA (agent pre"
                                                                                       "-trained on FMNIST"))
    assert row.endswith("| n/a | 95.50 ± 0.71 (2 seeds) | n/a |")
    verdict = tables.render_verdict(tables.T4, tables.T4_MINE, tmp_path).splitlines()
    line = next(x for x in verdict if x.startswith("| MNIST* |"))
    assert line.startswith("| MNIST* | pFedRLLA (agent pre-trained on FMNIST s = 4: new scenario): 95.50 (2 seeds) | "
                           "Local-only: 92.50 (2 seeds) | +3.00 [")


def test_t4_ablation_bp_and_ap_average_the_last_rounds_and_both_is_the_t4_pfedrlla_row(tmp_path, tables):
    """BP / AP of an ablation variant are the means of ``bp_acc`` / ``ap_acc`` over its run's last
    ``ABLATION_LAST`` rounds (earlier rounds and rounds without them left out); the "Both" row reads T4's own
    pFedRLLA runs, at the seeds the variants were run at (seed 1 of T4 is left out)."""
    run = _run(tmp_path, "results/t4/ablations/fmnist-pat2/pfedrlla-head", 0, method="pfedrlla",
               best_accuracy=0.97, rounds_to_target=30)
    last = tables.ABLATION_LAST
    rows = [{"round": r, "bp_acc": 0.0, "ap_acc": 0.0} for r in range(1, 11)]  # too early: not averaged
    rows += [{"round": 10 + r, "bp_acc": 0.5 + 0.02 * r, "ap_acc": 0.9} for r in range(1, last + 1)]
    rows.insert(12, {"round": 12, "acc": 0.5})  # an evaluation-only line: no bp_acc
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in rows) + "\n")
    _run(tmp_path, "results/t4/fmnist-pat2/pfedrlla", 0, method="pfedrlla", best_accuracy=0.98, rounds_to_target=20)
    _run(tmp_path, "results/t4/fmnist-pat2/pfedrlla", 1, method="pfedrlla", best_accuracy=0.90, rounds_to_target=40)
    text = tables.render_ablation(tables.T4_ABLATIONS, repo=tmp_path).splitlines()
    head = next(x for x in text if x.startswith("| Head:"))
    bp = 100 * (0.5 + 0.02 * (last + 1) / 2)  # mean of 0.52 ... 0.50 + 0.02 * last
    assert head.endswith(f"| {bp:.2f} (1 seed) | 90.00 (1 seed) | 97.00 (1 seed) | 30.0 (1 seed) |")
    both = next(x for x in text if x.startswith("| Both:"))
    assert both.endswith("| - | - | 98.00 (1 seed) | 20.0 (1 seed) |")  # its metrics.jsonl here has no bp_acc
    assert "| None: body and head averaged (FedAvg's aggregation) | not run | not run | not run | not run |" in text


def test_left_lists_the_missing_seeds_and_asks_three_for_an_unclear_ala_gain(tables, tmp_path):
    """``tables.py left``: a T4 main-column row with seed 0 misses seeds 1 and 2; an ALA pair whose gain is
    under a point (or of both signs) needs three seeds, a clear or diverged one only its first; the Dir(0.1)
    column asks for the two best baselines of the main column and no other."""
    for key, acc, spr in (("fedphp", 0.99, 30), ("fedavg-ft", 0.98, 12), ("local", 0.97, 6), ("pfedrlla", 0.96, 18)):
        _run(tmp_path, f"results/t4/fmnist-pat2/{key}", 0, best_accuracy=acc, seconds_per_round=spr, rounds=100)
    _run(tmp_path, "results/t4/fmnist-pat2/pfedrlla", 2, best_accuracy=0.95)
    for host, gains in (("ditto", (0.004,)), ("pfedme", (0.02,)), ("fedrep", (0.02, -0.03))):
        for seed, g in enumerate(gains):
            _run(tmp_path, f"results/ala/dir/{host}", seed, best_accuracy=0.9)
            _run(tmp_path, f"results/ala/dir/{host}+ala", seed, best_accuracy=0.9 + g)
    _run(tmp_path, "results/ala/dir/partialfed", 0, best_accuracy=0.9)
    _run(tmp_path, "results/ala/dir/partialfed+ala", 0, status="diverged", best_accuracy=None)
    out = tables.left(tmp_path)
    got = {line.split(":")[0]: line for line in out}
    assert got["t4 fmnist-pat2 fedphp"] == "t4 fmnist-pat2 fedphp: have [0], missing [1, 2]; 50 min a run"
    assert got["t4 fmnist-pat2 pfedrlla"] == "t4 fmnist-pat2 pfedrlla: have [0, 2], missing [1]; 30 min a run"
    # no run of its own: the median of the column's rows (10, 20, 30, 50 min)
    assert got["t4 fmnist-pat2 fedala"] == "t4 fmnist-pat2 fedala: have [], missing [0, 1, 2]; about 25 min a run"
    assert got["t4 fmnist-dir0.1 fedphp"].endswith("missing [0]; about 50 min a run")  # its FMNIST s = 2 runs
    assert out[-1].startswith(f"left: {sum(len(x.split('missing [')[1].split(']')[0].split(',')) for x in out[:-1])} runs")
    dir01 = sorted(k.split()[-1] for k in got if k.startswith("t4 fmnist-dir0.1 "))
    assert dir01 == ["fedavg-ft", "fedphp", "pfedrlla", "pfedrlla-pretrained"]
    for key in ("ditto", "ditto+ala"):  # +0.4 points: unclear
        assert got[f"ala dir {key}"] == f"ala dir {key}: have [0], missing [1, 2] (ALA gain's sign unclear)"  # no cost
    assert got["ala dir fedrep+ala"].endswith("have [0, 1], missing [2] (ALA gain's sign unclear)")  # +2, -3
    for key in ("pfedme", "pfedme+ala", "partialfed", "partialfed+ala"):  # +2 points; a divergence
        assert f"ala dir {key}" not in got
    assert "ala dir perfedavg: have [], missing [0]" in got.values()


def test_left_commands_repeat_a_rows_run_config_pretrain_a_missing_agent_and_use_recipes(tables, tmp_path):
    """``tables.py left --commands``: a missing seed of a row with a run repeats that run's ``config.toml`` at its
    commit with the seed changed; a pre-trained row whose agent file is absent is preceded, once, by the
    pre-training run that ``results/t4/pretrain`` says made it (and not when the file is there); a row with no
    run in the column gets its recipe at the commit of the column's runs."""
    pre = _run(tmp_path, "results/t4/fmnist-pat2/pfedrlla-pretrained", 0, best_accuracy=0.9, seconds_per_round=12,
               rounds=100)
    (pre / "config.toml").write_text('# git_commit: aaa111\nseed = 0\n[options]\nagent = "agents/a.pt"\n')
    agent_run = _run(tmp_path, "results/t4/pretrain/x", 0, seconds_per_round=30, rounds=100)
    (agent_run / "config.toml").write_text("# git_commit: bbb222\nseed = 0\n")
    (agent_run / "agent.sha256").write_text("0123abcd  a.pt\n")
    col = _run(tmp_path, "results/t4/mnist-domains/pfedrlla", 0, best_accuracy=0.8, seconds_per_round=18, rounds=100)
    (col / "config.toml").write_text("# git_commit: ccc333\nseed = 0\n")
    (tmp_path / "configs/t4").mkdir(parents=True)
    (tmp_path / "configs/t4/t4-mnist_star-domains-fedavg.toml").write_text('method = "fedavg"\n')
    out = tables.commands(tmp_path, out_root="R")
    rows = [line.split("\t") for line in out if not line.startswith("#")]
    pretrain = [i for i, r in enumerate(rows) if r[2].startswith("fedblend pretrain")]
    assert len(pretrain) == 1 and rows[pretrain[0]] == [
        "50", "bbb222", f"fedblend pretrain {agent_run / 'config.toml'} --out agents/a.pt"]
    mine = [r for r in rows if "R/t4/fmnist-pat2/pfedrlla-pretrained/" in r[2]]
    assert mine == [["20", "aaa111", f"fedblend run {pre / 'config.toml'} --set seed={s} "
                     f"--out R/t4/fmnist-pat2/pfedrlla-pretrained/seed{s}"] for s in (1, 2)]
    assert pretrain[0] < rows.index(mine[0])
    five_hundred = [r for r in rows if "R/t4-500/fmnist-pat2/pfedrlla-pretrained/" in r[2]]  # the 100-round config
    assert [r[2] for r in five_hundred] == [  # run to 500 rounds, after its agent's pre-training
        "fedblend run results/t4/fmnist-pat2/pfedrlla-pretrained/seed0/config.toml --set rounds=500 --set "
        "name=t4-500-fmnist-pat2-pfedrlla-pretrained --set seed=0 --out R/t4-500/fmnist-pat2/pfedrlla-pretrained/seed0"]
    assert pretrain[0] < rows.index(five_hundred[0])
    assert not any("R/t4-500/fmnist-pat2/fedphp/" in r[2] for r in rows)  # no 100-round run: no recipe
    ditto = next(r for r in rows if "R/t4/mnist-domains/ditto/" in r[2])
    assert ditto[1] == "ccc333" and ditto[2] == (
        "fedblend run configs/t4/t4-mnist_star-domains-fedavg.toml --set rounds=100 --set eval.every=10 "
        "--set method=ditto --set name=t4-mnist_star-domains-ditto --set seed=0 --out R/t4/mnist-domains/ditto/seed0")
    assert "# ala dir fedphp: the runs of results/t1/dir/fedphp" in out  # T1's runs: no second command
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents/a.pt").write_bytes(b"")
    assert not any("fedblend pretrain" in line for line in tables.commands(tmp_path))


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k: v})
    return out


def test_t4_recipes_resolve_to_the_committed_runs_configs(tables):
    """Every T4 row that has a committed run: its recipe (``tables.recipe``), resolved by this code, gives every
    field of that run's config the same value (seed aside; fields added since, like a new option's default, are
    not in the old config), so ``left --commands`` runs the missing columns and seeds with the rows' settings."""
    import tomllib

    from fedblend.config import load_config, migrate_eval

    checked = 0
    for table in (tables.T4, tables.T4_ABLATIONS):
        for column, _ in table.columns:
            for row in table.rows:
                runs = sorted((tables.REPO / table.root / column / row.key).glob("seed*/config.toml"))
                if row.root or not runs:
                    continue
                config, sets = tables.recipe(table, column, row.key)
                new = _flat(load_config(tables.REPO / config, sets).resolved())
                old = _flat(migrate_eval(tomllib.loads(runs[0].read_text()))[0])  # [eval] model since
                assert {k: (v, new.get(k)) for k, v in old.items() if k != "seed" and v != new.get(k)} == {}, \
                    (table.name, column, row.key)
                checked += 1
    assert checked >= 12


def test_collect_left_puts_each_finished_run_in_its_tables_folder_and_keeps_existing_seeds(tables, tmp_path):
    """``collect-left``: ``runs/<table>/<column>/<row>/seed<S>`` goes to the table's results root (T4's
    ablations under ``results/t4/ablations``), the row taken from the path (a pre-trained row's runs have the
    method ``pfedrlla``); an unfinished run is not copied, and a seed already in ``results/`` is not replaced."""
    runs = tmp_path / "runs"
    _run(runs, "t4/fmnist-pat2/pfedrlla-pretrained", 1, method="pfedrlla", best_accuracy=0.9)
    _run(runs, "t4-ablations/fmnist-pat2/pfedrlla-none", 0, method="pfedrlla", best_accuracy=0.8)
    _run(runs, "ala/dir/pfedme", 2, method="pfedme", status="diverged")
    _run(runs, "t4/mnist-domains/local", 0, method="local", status="running")
    _run(runs, "t4/fmnist-pat2/fedavg", 1, method="fedavg", best_accuracy=0.7)
    kept = _run(tmp_path, "results/t4/fmnist-pat2/fedavg", 1, method="fedavg", best_accuracy=0.6)
    copied, skipped = tables.collect_left(runs, tmp_path)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in copied) == [
        "results/ala/dir/pfedme/seed2", "results/t4/ablations/fmnist-pat2/pfedrlla-none/seed0",
        "results/t4/fmnist-pat2/pfedrlla-pretrained/seed1"]
    assert all(sorted(f.name for f in p.iterdir()) == sorted(tables.RUN_FILES) for p in copied)
    assert skipped == [kept] and json.loads((kept / "summary.json").read_text())["best_accuracy"] == 0.6


def test_collect_left_records_the_sha256_of_the_agent_a_pretrained_run_loaded(tables, tmp_path):
    """A pre-trained row's run from before runs recorded their inputs gets ``agent.sha256`` beside its files (the
    agent file under the runs' working directory: a re-made agent can differ from the committed one); a run that
    records it in ``run.inputs``, or loads no agent, gets none; an agent file that is gone stops the collection."""
    import hashlib

    base = tmp_path / "camp"
    old = _run(base / "runs", "t4/fmnist-pat2/pfedrlla-pretrained", 1, method="pfedrlla")
    new = _run(base / "runs", "t4/fmnist-pat2/pfedrlla-pretrained", 2, method="pfedrlla",
               run={"inputs": {"options.agent": "abc"}})
    for d in (old, new):
        (d / "config.toml").write_text('seed = 1\n[options]\nagent = "agents/a.pt"\n')
    _run(base / "runs", "t4/fmnist-pat2/pfedrlla", 1, method="pfedrlla")
    (base / "agents").mkdir()
    (base / "agents" / "a.pt").write_bytes(b"agent B")
    copied, _ = tables.collect_left(base / "runs", tmp_path)
    got = {p.relative_to(tmp_path / "results/t4").as_posix(): sorted(f.name for f in p.iterdir()) for p in copied}
    assert got == {"fmnist-pat2/pfedrlla-pretrained/seed1": sorted([*tables.RUN_FILES, "agent.sha256"]),
                   "fmnist-pat2/pfedrlla-pretrained/seed2": sorted(tables.RUN_FILES),
                   "fmnist-pat2/pfedrlla/seed1": sorted(tables.RUN_FILES)}
    sha = (tmp_path / "results/t4/fmnist-pat2/pfedrlla-pretrained/seed1/agent.sha256").read_text()
    assert sha == f"{hashlib.sha256(b'agent B').hexdigest()}  a.pt\n"
    (base / "agents" / "a.pt").unlink()
    _run(base / "runs", "t4/fmnist-pat2/pfedrlla-pretrained", 0, method="pfedrlla")
    (base / "runs/t4/fmnist-pat2/pfedrlla-pretrained/seed0/config.toml").write_text('[options]\nagent = "agents/a.pt"\n')
    with pytest.raises(SystemExit, match="agent file .* is gone"):
        tables.collect_left(base / "runs", tmp_path)
    assert not (tmp_path / "results/t4/fmnist-pat2/pfedrlla-pretrained/seed0").exists()  # not copied without it


def test_an_authors_settings_row_stands_beside_its_shared_row_only_once_it_has_runs(tmp_path, tables):
    """Issue #51: APPLE's and DBE's rows with their authors' settings (``Row.config``) are absent from T1 and
    from T1 against FedAPA until a run of theirs exists (the committed tables do not move); with one, the row
    follows its shared-setting row, labelled with the setting it changes, and a DBE row that applies to the
    pathological column alone reads "n/a" in the other."""
    _run(tmp_path, "results/t1/dir/apple", 0, method="apple", best_accuracy=0.8, rounds=2, status="diverged",
         divergence={"round": 3})
    _run(tmp_path, "results/t1/pat/apple", 0, method="apple", best_accuracy=0.99)
    _run(tmp_path, "results/t1/pat/dbe", 0, method="dbe", best_accuracy=0.54)
    _run(tmp_path, "results/t1/pat/fedapa", 0, method="fedapa", best_accuracy=0.993)
    before = tables.render(tables.T1, tmp_path)
    assert "authors' settings" not in before + tables.render_paired(tables.T1, "fedapa", tmp_path)
    _run(tmp_path, "results/t1/dir/apple-own", 0, method="apple", best_accuracy=0.95)
    _run(tmp_path, "results/t1/dir/apple-own", 1, method="apple", best_accuracy=0.3, rounds=9, status="diverged",
         divergence={"round": 10})
    _run(tmp_path, "results/t1/pat/dbe-own", 0, method="dbe", best_accuracy=0.98)
    lines = tables.render(tables.T1, tmp_path).splitlines()
    labels = [line.split(" | ")[0][2:] for line in lines[2:]]
    assert labels[labels.index("APPLE") + 1] == "APPLE (authors' optimiser: SGD momentum 0.9, core lr 0.01, DR lr 0.001)"
    assert labels[labels.index("DBE") + 1] == "DBE (authors' settings: SGD without momentum)"
    assert ("| APPLE (authors' optimiser: SGD momentum 0.9, core lr 0.01, DR lr 0.001) | not run [99.06] | 95.00 "
            "(1 seed); diverged: seed 1 (round 10) [95.42] |") in lines
    assert "| APPLE | 99.00 (1 seed) [99.06] | diverged: seed 0 (round 3) [95.42] |" in lines  # unchanged
    assert "| DBE (authors' settings: SGD without momentum) | 98.00 (1 seed) [99.20] | n/a |" in lines
    assert [line for line in lines if "authors'" not in line] == before.splitlines()
    paired = tables.render_paired(tables.T1, "fedapa", tmp_path)
    assert "| DBE (authors' settings: SGD without momentum) | -1.30 (1 seed) | - |" in paired.splitlines()


def test_a_diverged_run_alone_shows_an_authors_settings_row(tmp_path, tables):
    """A row of its own config that only diverged is a result too: it is shown, naming the divergence."""
    _run(tmp_path, "results/t1/pat/apple-own", 2, method="apple", best_accuracy=0.5, rounds=1, status="diverged",
         divergence={"round": 2})
    assert ("| APPLE (authors' optimiser: SGD momentum 0.9, core lr 0.01, DR lr 0.001) | diverged: seed 2 (round 2) "
            "[99.06] | not run [95.42] |") in tables.render(tables.T1, tmp_path).splitlines()


def test_left_commands_run_an_authors_settings_row_from_its_config_at_head(tables, tmp_path):
    """``left --commands``: an authors'-settings row without runs is run from its own config (the column filled
    in) at HEAD, the commit that has that config, into ``OUT/t1/<column>/<row>/seed<S>`` where ``collect-left``
    and the table look; its minutes are the shared-setting row's (same method), and the DBE row asks only for
    the column it applies to."""
    _run(tmp_path, "results/t1/pat/apple", 0, method="apple", best_accuracy=0.99, seconds_per_round=24, rounds=50)
    col = _run(tmp_path, "results/t1/dir/fedala", 0, method="fedala", best_accuracy=0.97)
    (col / "config.toml").write_text("# git_commit: ccc333\nseed = 0\n")
    out = tables.commands(tmp_path, out_root="R")
    own = [line.split("\t") for line in out if "-own/" in line]
    assert ["20", "HEAD", "fedblend run configs/benchmarks/t1-fmnist-dir-apple-own.toml --set seed=1 "
            "--out R/t1/dir/apple-own/seed1"] in own
    assert ["20", "HEAD", "fedblend run configs/benchmarks/t1-fmnist-pat-apple-own.toml --set seed=0 "
            "--out R/t1/pat/apple-own/seed0"] in own
    assert sorted(r[2].split("--out ")[1] for r in own if "dbe-own" in r[2]) == [
        f"R/t1/pat/dbe-own/seed{s}" for s in (0, 1, 2)]
    assert len(own) == 9


def test_authors_settings_configs_change_only_the_setting_their_row_names(tables):
    """Each authors'-settings config is the T1 config its shared-setting row ran (``t1-fmnist-<column>-fedavg.toml``
    with the method set) with only the fields its label names changed (and its name): never tuned further."""
    from fedblend.config import load_config

    changed = {"apple-own": {"options.dr_lr": (0.01, 0.001), "options.momentum": (0.0, 0.9),
                             "options.core_lr_scale": (None, 1.0)},
               "dbe-own": {"train.momentum": (0.9, 0.0)}}
    checked = 0
    for row in tables.T1.rows:
        if not row.config:
            continue
        for column, _ in tables.T1.columns:
            if not row.applies(column):
                assert not (tables.REPO / row.config.format(column=column)).exists()
                continue
            own = load_config(tables.REPO / row.config.format(column=column))
            shared = load_config(tables.REPO / f"configs/benchmarks/t1-fmnist-{column}-fedavg.toml",
                                 [f"method={own.method}"])
            new, old = _flat(own.resolved()), _flat(shared.resolved())
            assert own.method == row.beside and set(old) <= set(new)  # an option unset (None) there: absent
            diff = {k: (old.get(k), v) for k, v in new.items() if old.get(k) != v}
            assert diff == {"name": (f"t1-fmnist-{column}-fedavg", f"t1-fmnist-{column}-{row.key}"),
                            **changed[row.key]}
            checked += 1
    assert checked == 3
