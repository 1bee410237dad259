"""The researcher's workflow: sweep (skip finished, resume killed), report --compare, PFLlib export / import,
TensorBoard logging, --dry-run, and the small commands (configs, methods NAME, --version)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fedblend.cli.main import main
from fedblend.config import load_config
from fedblend.experiment import run_experiment
from tests.helpers import without_timings

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = """# tiny synthetic run for the workflow tests
method = "{method}"
dataset = "synthetic"
model = "mlp"
rounds = 4
checkpoint_every = 1
[partition]
num_clients = 3
min_samples = 5
[train]
lr = 0.05
[log]
plot = false
"""


def _config(tmp_path: Path, method: str = "fedavg") -> Path:
    path = tmp_path / f"tiny-{method}.toml"
    path.write_text(TINY.format(method=method))
    return path


def _history(run: Path) -> list[dict]:
    return without_timings([json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()])


# ------------------------------------------------------------------------------------------------ sweep
def test_sweep_skips_finished_resumes_killed_and_restarts_uncheckpointed(tmp_path, capsys):
    from fedblend.cli.sweep import plan, sweep

    cfg_path = _config(tmp_path)
    out = tmp_path / "sw"
    # seed 0 finished, seed 1 killed after round 2 (checkpoint at round 2), seed 2 killed before any checkpoint
    cfg = load_config(cfg_path)
    for seed, stop in ((0, None), (1, 2)):
        cfg.seed = seed
        run_experiment(cfg, out / "tiny-fedavg" / f"seed{seed}", stop_after=stop)
    cfg.seed, cfg.checkpoint_every = 2, 0
    run_experiment(cfg, out / "tiny-fedavg" / "seed2", stop_after=1)
    finished_before = (out / "tiny-fedavg" / "seed0" / "summary.json").read_bytes()
    runs = plan([str(cfg_path)], [0, 1, 2, 3], [], [], out)
    assert [r.action for r in runs] == ["skip", "resume", "restart", "start"]
    assert "--resume" in runs[1].cmd and "--force" in runs[2].cmd
    assert sweep(runs, 2, out, report_plots=False) == 0
    text = capsys.readouterr().out
    assert "[done] tiny-fedavg seed 0" in text and "seed 1 resumed" in text and "seed 3" in text
    assert "| synthetic-dirichlet-fedavg |" in text and " | 4 | 4 |" in text  # 4 seeds, 4 rounds
    assert (out / "tiny-fedavg" / "seed0" / "summary.json").read_bytes() == finished_before  # not rerun
    # the resumed run equals an uninterrupted one
    cfg.seed, cfg.checkpoint_every = 1, 1
    run_experiment(cfg, tmp_path / "ref1")
    assert _history(out / "tiny-fedavg" / "seed1") == _history(tmp_path / "ref1")
    again = plan([str(cfg_path)], [0, 1, 2, 3], [], [], out)
    assert {r.action for r in again} == {"skip"}
    # a different config in a finished run's place is refused, not overwritten
    other = plan([str(cfg_path)], [0], [], ["train.lr=0.1"], out)
    assert other[0].action == "refuse" and "another config" in other[0].why


def test_sweep_refuses_a_finished_run_whose_input_file_changed_since(tmp_path):
    """A finished run of the same config is skipped only if the files it names (here ``init``) still hold what it
    was made with: a re-made file at the same path makes the same config another run."""
    import torch

    from fedblend.cli.sweep import plan
    from fedblend.core.checkpoint import load_checkpoint

    cfg_path, out = _config(tmp_path), tmp_path / "sw"
    run_experiment(load_config(cfg_path), tmp_path / "plain")
    weights = tmp_path / "w.pt"
    torch.save(load_checkpoint(tmp_path / "plain" / "checkpoint.pt")["server"]["global"], weights)
    sets = [f"init='{weights}'"]
    run_experiment(load_config(cfg_path, sets), out / "tiny-fedavg" / "seed0")
    assert plan([str(cfg_path)], [0], [], sets, out)[0].action == "skip"
    torch.save({k: v * 2 for k, v in torch.load(weights).items()}, weights)
    refused = plan([str(cfg_path)], [0], [], sets, out)[0]
    assert refused.action == "refuse" and "made with another init file" in refused.why and str(weights) in refused.why


def test_sweep_grid_product_and_names(tmp_path):
    from fedblend.cli.sweep import parse_grid, plan

    assert parse_grid(["train.lr=0.01,0.05", "partition.alpha=0.1,1.0"]) == [
        ["train.lr=0.01", "partition.alpha=0.1"], ["train.lr=0.01", "partition.alpha=1.0"],
        ["train.lr=0.05", "partition.alpha=0.1"], ["train.lr=0.05", "partition.alpha=1.0"]]
    assert parse_grid(['ala.layer_idx=[1,2],[3]']) == [["ala.layer_idx=[1,2]"], ["ala.layer_idx=[3]"]]
    runs = plan([str(_config(tmp_path))], [0, 1], ["train.lr=0.01,0.05"], ["rounds=2"], tmp_path / "o")
    assert len(runs) == 4 and len({r.out for r in runs}) == 4
    assert runs[0].out.parent.name == "tiny-fedavg__train.lr=0.01"
    assert runs[0].cmd.count("--set") == 3  # rounds, lr, seed
    from fedblend.common.errors import ConfigError

    with pytest.raises(ConfigError, match="train.lr"):  # a bad grid value fails before anything runs
        plan([str(_config(tmp_path))], [0], ["train.lr=-1"], [], tmp_path / "o")


# ------------------------------------------------------------------------------------------------ compare
def _fake_run(root: Path, label: str, seed: int, best: float, final: float, **extra) -> None:
    d = root / f"{label}-s{seed}"
    d.mkdir(parents=True)
    cfg = {"method": label, "seed": seed, "rounds": 2}
    s = {"status": "finished", "label": label, "method": label, "seed": seed, "rounds": 2, "best_accuracy": best,
         "final_accuracy": final, "seconds_per_round": 1.0, "run": {"config": cfg}, **extra}
    (d / "summary.json").write_text(json.dumps(s))
    (d / "metrics.jsonl").write_text("".join(json.dumps({"round": r, "acc": best, "loss": 1.0 / r}) + "\n"
                                             for r in (1, 2)))


def test_compare_paired_differences_on_hand_made_summaries(tmp_path):
    from fedblend.results.report import report

    a = {0: 0.90, 1: 0.80, 2: 0.85, 3: 0.70}  # B's seed 3 is missing: paired over seeds 0-2 only
    b = {0: 0.88, 1: 0.77, 2: 0.84}
    for s, v in a.items():
        _fake_run(tmp_path / "runs", "fedapa", s, v, v - 0.01)
    for s, v in b.items():
        _fake_run(tmp_path / "runs", "fedala", s, v, v)
    text = report([tmp_path / "runs"], tmp_path / "rep", plots=True, compare=("fedapa", "fedala"))
    c = json.loads((tmp_path / "rep" / "compare.json").read_text())
    m = c["metrics"]["best_accuracy"]
    assert c["seeds"] == [0, 1, 2]
    assert m["per_seed"] == pytest.approx({"0": 2.0, "1": 3.0, "2": 1.0})
    # d = (2, 3, 1): mean 2, sample std 1, sem 1/sqrt(3), t_{0.975, 2} = 4.302652729749464
    half = 4.302652729749464 / np.sqrt(3)
    assert m["mean"] == pytest.approx(2.0) and m["std"] == pytest.approx(1.0)
    assert m["ci"] == pytest.approx([2 - half, 2 + half])
    assert 0 < m["p"] < 0.1
    assert c["metrics"]["final_accuracy"]["per_seed"] == pytest.approx({"0": 1.0, "1": 2.0, "2": 0.0})
    assert "fedapa - fedala" in text and "+2.00" in text
    assert (tmp_path / "rep" / "table.csv").read_text().splitlines()[0].startswith("run,method,config,seeds")
    assert "\\begin{tabular}" in (tmp_path / "rep" / "table.tex").read_text()
    assert (tmp_path / "rep" / "accuracy.png").stat().st_size > 1000
    from fedblend.common.errors import ConfigError

    with pytest.raises(ConfigError, match="matches no group"):
        report([tmp_path / "runs"], compare=("fedavg", "fedala"))
    from fedblend.results.compare import find_group
    from fedblend.results.runs import find_runs
    from fedblend.results.table import aggregate

    rows = aggregate(find_runs([tmp_path / "runs"]))
    assert find_group(rows, "fedala")["label"] == "fedala"
    with pytest.raises(ConfigError, match="matches 2 groups"):
        find_group(rows, "feda")


def test_compare_pairs_rounds_to_target_over_seeds_where_both_reached_it(tmp_path):
    from fedblend.results.report import report

    # A reaches 85 % at rounds 10, 20, 30 (seed 3: never); B at 30, 30, never, 40
    a = {0: 10, 1: 20, 2: 30, 3: None}
    b = {0: 30, 1: 30, 2: None, 3: 40}
    for s in range(4):
        _fake_run(tmp_path / "runs", "pfedrlla", s, 0.9, 0.9, target_accuracy=0.85, rounds_to_target=a[s])
        _fake_run(tmp_path / "runs", "ditto", s, 0.9, 0.9, target_accuracy=0.85, rounds_to_target=b[s])
    text = report([tmp_path / "runs"], tmp_path / "rep", plots=False, compare=("pfedrlla", "ditto"))
    m = json.loads((tmp_path / "rep" / "compare.json").read_text())["metrics"]["rounds_to_target"]
    assert m["unit"] == "rounds" and m["target"] == 0.85
    assert m["per_seed"] == pytest.approx({"0": -20.0, "1": -10.0})  # seeds 2 and 3 cannot be paired
    assert m["mean"] == pytest.approx(-15.0) and m["std"] == pytest.approx(np.sqrt(50))
    assert m["not_reached"] == {"a": [3], "b": [2]}
    assert "rounds to 85% (in rounds) | -20.00 | -10.00 | - | - | -15.00" in text
    assert "ditto did not reach it at seed(s) 2" in text and "pfedrlla did not reach it at seed(s) 3" in text


def test_compare_leaves_out_rounds_to_target_when_the_targets_differ(tmp_path):
    from fedblend.results.compare import find_group, paired_differences
    from fedblend.results.runs import find_runs
    from fedblend.results.table import aggregate

    _fake_run(tmp_path / "runs", "a", 0, 0.9, 0.9, target_accuracy=0.85, rounds_to_target=10)
    _fake_run(tmp_path / "runs", "b", 0, 0.9, 0.9, target_accuracy=0.90, rounds_to_target=10)
    _fake_run(tmp_path / "runs", "c", 0, 0.9, 0.9)  # no target at all
    rows = aggregate(find_runs([tmp_path / "runs"]))
    assert "rounds_to_target" not in paired_differences(find_group(rows, "a"), find_group(rows, "b"))["metrics"]
    assert "rounds_to_target" not in paired_differences(find_group(rows, "a"), find_group(rows, "c"))["metrics"]
    assert "best_accuracy" in paired_differences(find_group(rows, "a"), find_group(rows, "c"))["metrics"]


def test_report_band_uses_the_tables_std():
    from fedblend.results.stats import mean_std

    vals = np.array([[1.0, 2.0], [3.0, 6.0]])
    mean, std = mean_std(vals)
    assert mean.tolist() == [2.0, 4.0] and std == pytest.approx([np.sqrt(2), np.sqrt(8)])  # ddof = 1


# ------------------------------------------------------------------------------------------------ PFLlib
def test_pflib_export_import_round_trip(tmp_path):
    from fedblend.data.federated import PartitionSpec, build_federated
    from fedblend.data.interop import export_pflib, import_pflib, read_pflib
    from fedblend.data.synthetic import make_synthetic

    raw = make_synthetic()
    for split in ("merge", "official"):
        spec = PartitionSpec(kind="dirichlet", alpha=0.5, num_clients=4, min_samples=5, split=split)
        fed = build_federated(raw, spec, seed=3)
        folder = export_pflib(raw, fed.indices, split, tmp_path / split)
        clients = read_pflib(folder)
        assert len(clients) == 4 and clients[0]["train"]["x"].dtype == np.float32
        assert clients[0]["train"]["x"].min() >= -1 and clients[0]["train"]["x"].max() <= 1
        cfg = json.loads((folder / "config.json").read_text())
        assert sum(n for c in cfg["Size of samples for labels in clients"] for _, n in c) == (
            fed.counts["train"].sum() + fed.counts["test"].sum())
        back = import_pflib(folder, raw, split)
        assert back == fed.indices  # bit-identical indices
        again = build_federated(raw, PartitionSpec(kind="indices", path=str(folder), num_clients=4, split=split), 0)
        for a, b in zip(again.clients, fed.clients):
            assert a.train_x.equal(b.train_x) and a.test_y.equal(b.test_y)


def test_indices_kind_reads_a_partition_json_and_checks_it(tmp_path, tiny_fed):
    from fedblend.data.federated import PartitionSpec, build_federated
    from fedblend.data.partition import PartitionError
    from fedblend.data.synthetic import make_synthetic

    tiny_fed.save(tmp_path / "p.json")
    spec = PartitionSpec(kind="indices", path=str(tmp_path / "p.json"), num_clients=4, split="merge")
    again = build_federated(make_synthetic(), spec, seed=7)
    assert again.indices == tiny_fed.indices
    with pytest.raises(PartitionError, match="num_clients = 4"):
        build_federated(make_synthetic(), PartitionSpec(kind="indices", path=str(tmp_path / "p.json")), 0)
    with pytest.raises(PartitionError, match="split"):
        build_federated(make_synthetic(), PartitionSpec(kind="indices", path=str(tmp_path / "p.json"),
                                                        num_clients=4, split="official"), 0)
    from fedblend.common.errors import ConfigError

    with pytest.raises(ConfigError, match="needs partition.path"):
        load_config(None, ["partition.kind='indices'"])


@pytest.mark.realdata
def test_import_pflibs_shipped_mnist_layout(real_data_dir):
    from fedblend.data.interop import class_counts, import_pflib
    from fedblend.data.sources import load_dataset

    folder = real_data_dir / "pflib-mnist"
    if not folder.is_dir():
        pytest.skip(f"PFLlib's MNIST layout not in {real_data_dir}")
    raw = load_dataset("mnist", real_data_dir)
    idx = import_pflib(folder, raw, "merge")
    counts = class_counts(idx, raw, "merge")
    assert counts["train"].sum() == 52492 and counts["test"].sum() == 17508
    sizes = json.loads((folder / "config.json").read_text())["Size of samples for labels in clients"]
    expect = np.zeros_like(counts["train"])
    for k, pairs in enumerate(sizes):
        for label, n in pairs:
            expect[k, label] = n
    assert (counts["train"] + counts["test"] == expect).all()


def test_flwr_kind_uses_the_named_partitioner():
    pytest.importorskip("flwr_datasets", reason="flwr-datasets not installed (pip install 'fedblend[flwr-datasets]')")
    from fedblend.data.interop import flwr_indices
    from fedblend.data.partition import PartitionError

    labels = np.repeat(np.arange(4), 50)
    parts = flwr_indices(labels, 5, "IidPartitioner", {}, 0)
    assert sorted(np.concatenate(parts).tolist()) == list(range(200)) and [len(p) for p in parts] == [40] * 5
    parts = flwr_indices(labels, 4, "PathologicalPartitioner", {"num_classes_per_partition": 1,
                                                                 "class_assignment_mode": "first-deterministic"}, 0)
    assert all(len(set(labels[p].tolist())) == 1 for p in parts)
    with pytest.raises(PartitionError, match="not a flwr-datasets partitioner"):
        flwr_indices(labels, 2, "NoSuchPartitioner", {}, 0)


# ------------------------------------------------------------------------------------------------ trackers
def test_tensorboard_holds_every_metrics_row(tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard not installed (pip install 'fedblend[tensorboard]')")
    from fedblend.tracking import export_tensorboard, read_tensorboard, scalar_row

    cfg = load_config(_config(tmp_path), ["log.tensorboard=true", "log.plot=true"])
    run_experiment(cfg, tmp_path / "run")
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert (tmp_path / "run" / "accuracy.png").stat().st_size > 1000
    for logdir in (tmp_path / "run" / "tensorboard", export_tensorboard(tmp_path / "run", tmp_path / "tb")):
        got = read_tensorboard(logdir)
        for m in rows:
            for k, v in scalar_row(m).items():
                assert got[k][m["round"]] == pytest.approx(v, rel=1e-6), (k, m["round"])
        assert set(got["acc"]) == {1, 2, 3, 4}


# ------------------------------------------------------------------------------------------------ small commands
def test_dry_run_writes_nothing(tmp_path, capsys):
    from tests.test_bad_inputs import snapshot

    cfg_path = _config(tmp_path)
    before = snapshot(tmp_path)
    assert main(["run", str(cfg_path), "--out", str(tmp_path / "out"), "--dry-run", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert snapshot(tmp_path) == before
    assert "nothing written" in out and "parameters" in out and "min for the run" in out
    from fedblend.experiment import dry_run

    d = dry_run(load_config(cfg_path))
    # FedAvg sends the whole model to each of the 3 clients of round 1 and gets it back
    assert d["bytes_down_round1"] == 3 * d["parameter_bytes"] and d["bytes_up_client"] == d["parameter_bytes"]
    assert snapshot(tmp_path) == before
    assert main(["sweep", str(cfg_path), "--seeds", "0", "1", "--out", str(tmp_path / "s"), "--dry-run"]) == 0
    assert snapshot(tmp_path) == before and capsys.readouterr().out.count("start") == 2


def test_dry_run_estimate_counts_evaluation(tmp_path):
    """The run estimate is training per round x rounds plus one evaluation of all clients per evaluating round
    (every ``eval.every`` and the last)."""
    import dataclasses

    from fedblend.experiment import dry_run

    base = load_config(_config(tmp_path))
    for rounds, every, evaluations in ((4, 1, 4), (5, 2, 3), (6, 3, 2)):
        cfg = dataclasses.replace(base, rounds=rounds, eval=dataclasses.replace(base.eval, every=every))
        d = dry_run(cfg)
        assert d["evaluations"] == evaluations
        assert d["seconds_one_client_eval"] > 0 and d["seconds_per_evaluation_estimate"] > 0
        assert d["seconds_run_estimate"] == pytest.approx(
            d["seconds_per_round_estimate"] * rounds + d["seconds_per_evaluation_estimate"] * evaluations)


def test_small_commands(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.startswith("fedblend ")
    assert main(["methods", "fedprox"]) == 0
    text = capsys.readouterr().out
    assert "mu = " in text and "float >= 0" in text
    assert main(["methods", "nosuch"]) == 2
    assert main(["configs", "quickstart"]) == 0
    assert "configs/quickstart.toml" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "``" not in capsys.readouterr().out


def test_progress_bars_count_clients_and_leave_results_alone(tmp_path):
    import io

    from fedblend.progress import Progress

    class Tty(io.StringIO):
        def isatty(self):
            return True

    stream = Tty()
    prog = Progress(4, "tiny", stream=stream)
    calls = []
    orig = prog.on_client
    prog.on_client = lambda kind, n: (calls.append((kind, n)), orig(kind, n))
    cfg = load_config(_config(tmp_path))
    run_experiment(cfg, tmp_path / "bar", progress=prog)
    prog.close()
    run_experiment(cfg, tmp_path / "plain")
    assert _history(tmp_path / "bar") == _history(tmp_path / "plain")
    assert calls.count(("train", 3)) == 4 and calls.count(("evaluate", 3)) == 4
    assert sum(1 for k, _ in calls if k == "done") == 4 * 3 * 2
    assert "4/4" in stream.getvalue() and "acc " in stream.getvalue()


def test_sigterm_stops_a_background_run_at_its_checkpoint(tmp_path):
    """A run started with SIGINT ignored (as a shell starts background jobs, and so ``nohup``-started sweeps'
    runs) still stops on SIGTERM like on Ctrl-C: exit 130, the resume command, its checkpoint kept; and the
    resumed run equals an uninterrupted one."""
    import os
    import signal
    import subprocess
    import sys
    import time

    cfg_path = tmp_path / "long.toml"
    cfg_path.write_text(TINY.format(method="fedavg").replace("rounds = 4", "rounds = 100000"))
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    cmd = [sys.executable, "-m", "fedblend.cli.main", "run", str(cfg_path), "--out", str(out), "--quiet",
           "--threads", "1"]
    p = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        deadline = time.time() + 120
        while not (out / "metrics.jsonl").exists() or len((out / "metrics.jsonl").read_text().splitlines()) < 3:
            assert p.poll() is None and time.time() < deadline, "the run did not get going"
            time.sleep(0.2)
        os.killpg(p.pid, signal.SIGTERM)
        rc = p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    err = p.stderr.read()
    assert rc == 130, err
    assert "--resume" in err and (out / "checkpoint.pt").exists() and not (out / "summary.json").exists()
    cfg = load_config(cfg_path)
    run_experiment(cfg, out, resume=True, stop_after=2)
    rows = len(_history(out))
    run_experiment(cfg, tmp_path / "ref", stop_after=rows)
    assert rows >= 5 and _history(out) == _history(tmp_path / "ref")


def test_dotted_keys_flattens_nested_tables_once_for_config_report_and_tracking():
    """One shared flattener (``common.jsonio.dotted_keys``) for config diffs, report labels and tracker params."""
    import fedblend.config.identity as config_mod  # config_diff
    import fedblend.results.table as report_mod
    import fedblend.tracking.mlflow as tracking_mod
    from fedblend.common.jsonio import dotted_keys

    assert dotted_keys({"a": 1, "t": {"b": [1, 2], "u": {"c": None}}}) == {"a": 1, "t.b": [1, 2], "t.u.c": None}
    assert dotted_keys(None) == {} and dotted_keys({}, "x.") == {}
    assert all(m.dotted_keys is dotted_keys for m in (report_mod, config_mod, tracking_mod))


class TestSweepExitCodes:
    """A sweep exits as every command does: 2 for bad input (a run refused because its directory holds another
    config's finished run or inputs, or busy), 1 for a fault (a failed run), 0 when every run is done."""

    @pytest.mark.parametrize("actions, rcs, code", [
        (["refuse"], [], 2),
        (["refuse", "skip"], [], 2),
        (["skip", "refuse", "refuse"], [], 2),
        (["busy"], [], 2),
        (["refuse", "start"], [1], 2),
        (["start"], [1], 1),
        (["skip", "start"], [0], 0),
        (["start"], [130], 130),
    ])
    def test_exit_code_of_the_runs(self, actions, rcs, code):
        from fedblend.cli.sweep import SweepRun, exit_code

        runs = [SweepRun("c.toml", [], i, Path(f"o/{i}"), "c", action=a) for i, a in enumerate(actions)]
        assert exit_code(runs, rcs) == code

    def test_a_finished_run_of_another_config_is_refused_with_exit_2(self, tmp_path, capsys):
        cfg_path, out = _config(tmp_path), tmp_path / "sw"
        run_experiment(load_config(cfg_path, ["train.lr=0.1"]), out / "tiny-fedavg" / "seed0")
        before = (out / "tiny-fedavg" / "seed0" / "summary.json").read_bytes()
        assert main(["sweep", str(cfg_path), "--seeds", "0", "--out", str(out), "--no-plots"]) == 2
        text = capsys.readouterr().out
        assert "[REFUSED] tiny-fedavg seed 0:" in text and "another config" in text
        assert (out / "tiny-fedavg" / "seed0" / "summary.json").read_bytes() == before
