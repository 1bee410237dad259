"""Trustworthy runs: run identity and resume refusal, overwrite protection, the non-finite guard, strict JSON,
report grouping and honest model selection (``eval.select = "val"``), and verified downloads."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from fedblend.cli.main import main
from fedblend.common.errors import NonFiniteError, ResumeMismatchError, RunExistsError
from fedblend.common.params import weighted_average
from fedblend.config import config_hash, load_config
from fedblend.core.checkpoint import load_checkpoint
from fedblend.experiment import default_out_dir, run_experiment, selection
from tests.helpers import tiny_sim
from tests.test_bad_inputs import BASE, snapshot

SYN = ["dataset=synthetic", "model=mlp", "rounds=2", "partition.num_clients=3", "partition.min_samples=5",
       "checkpoint_every=1"]


def _cfg(*extra: str):
    return load_config(None, [*SYN, *extra])


def _strict(path: Path):
    """Parse a JSON file rejecting NaN / Infinity (what strict readers do)."""
    def bad(name):
        raise ValueError(f"non-strict JSON constant {name} in {path}")
    text = path.read_text()
    if path.suffix == ".jsonl":
        return [json.loads(line, parse_constant=bad) for line in text.splitlines() if line]
    return json.loads(text, parse_constant=bad)


# ------------------------------------------------------------------------------------------------ identity
def test_identity_recorded_in_summary_config_and_checkpoint(tmp_path):
    cfg = _cfg('method="fedprox+ala"')
    run_experiment(cfg, tmp_path / "r")
    s = _strict(tmp_path / "r" / "summary.json")
    run = s["run"]
    assert run["config"]["options"] == {"mu": 0.01} and run["config"]["ala"]["eta"] == 1.0  # defaults filled in
    assert "batch_size" not in run["config"]["ala"]  # an unset option stays unset (TOML has no null)
    assert s["config_hash"] == run["config_hash"] == config_hash(run["config"])
    assert {"fedblend", "torch", "numpy", "python", "git_commit", "device", "threads", "cpu"} <= set(run)
    assert run["torch"] == torch.__version__ and run["threads"] == torch.get_num_threads()
    assert run["cpu"]["capability"] == torch.backends.cpu.get_cpu_capability() and run["cpu"]["model"]
    assert "cpu_history" not in run  # one CPU
    again = load_config(tmp_path / "r" / "config.toml")  # config.toml is the resolved config and loads back
    assert again.resolved() == run["config"]
    assert f"# config_hash: {s['config_hash']}" in (tmp_path / "r" / "config.toml").read_text()
    ck = load_checkpoint(tmp_path / "r" / "checkpoint.pt")
    assert ck["extra"]["identity"]["config"] == run["config"]


def test_identity_records_the_sha256_of_every_input_file_the_config_names(tmp_path):
    """``init``, ``partition.path`` (a file or a folder) and file options (``options.agent``) are recorded by
    path in the config and by content in the identity (summary, config.toml header, checkpoint); a run that
    reads no such file records no ``inputs``."""
    from fedblend.common.files import sha256_tree

    plain = tmp_path / "plain"
    run_experiment(_cfg(), plain)
    assert "inputs" not in _strict(plain / "summary.json")["run"]
    assert "# input " not in (plain / "config.toml").read_text()
    weights = tmp_path / "w.pt"
    torch.save(load_checkpoint(plain / "checkpoint.pt")["server"]["global"], weights)
    first = tmp_path / "first"
    run_experiment(_cfg(f'init="{weights}"', "partition.kind=indices", f'partition.path="{plain / "partition.json"}"'),
                   first)
    digest = hashlib.sha256(weights.read_bytes()).hexdigest()
    part = hashlib.sha256((plain / "partition.json").read_bytes()).hexdigest()
    run = _strict(first / "summary.json")["run"]
    assert run["inputs"] == {"init": {"path": str(weights), "sha256": digest},
                             "partition.path": {"path": str(plain / "partition.json"), "sha256": part}}
    assert f"# input init: {weights} sha256 {digest}\n" in (first / "config.toml").read_text()
    assert load_checkpoint(first / "checkpoint.pt")["extra"]["identity"]["inputs"] == run["inputs"]
    folder = tmp_path / "folder"
    (folder / "sub").mkdir(parents=True)
    (folder / "a").write_bytes(b"1")
    (folder / "sub" / "b").write_bytes(b"2")
    before = sha256_tree(folder)
    (folder / "sub" / "b").write_bytes(b"3")
    changed = sha256_tree(folder)
    (folder / "sub" / "b").rename(folder / "b")
    assert len({before, changed, sha256_tree(folder)}) == 3  # a changed file, a moved file: other hashes
    assert sha256_tree(weights) == digest


def test_resume_keeps_the_input_file_the_run_started_from_and_warns_when_it_changed(tmp_path):
    plain = tmp_path / "plain"
    run_experiment(_cfg(), plain)
    weights = tmp_path / "w.pt"
    torch.save(load_checkpoint(plain / "checkpoint.pt")["server"]["global"], weights)
    started = hashlib.sha256(weights.read_bytes()).hexdigest()
    cfg = _cfg(f'init="{weights}"')
    run_experiment(cfg, tmp_path / "r", stop_after=1)
    torch.save({k: v + 1 for k, v in torch.load(weights).items()}, weights)  # re-made in place
    with pytest.warns(RuntimeWarning, match=r"init: .*w\.pt is not the file .* started from"):
        run_experiment(cfg, tmp_path / "r", resume=True)
    assert _strict(tmp_path / "r" / "summary.json")["run"]["inputs"]["init"]["sha256"] == started


def test_resume_under_other_cpu_kernels_warns_and_records_each_cpu(tmp_path):
    """A run resumed where torch runs other kernels (here: its portable ones, in a fresh process) continues, says
    its floats may differ from an uninterrupted run's in the last bits, and its summary names both CPUs."""
    import os
    import subprocess
    import sys

    if torch.backends.cpu.get_cpu_capability() == "DEFAULT":
        pytest.skip("this CPU already runs torch's portable kernels")
    out = tmp_path / "r"
    run_experiment(_cfg(), out, stop_after=1)
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default"}
    res = subprocess.run([sys.executable, "-m", "fedblend.cli.main", "run", str(out / "config.toml"), "--out",
                          str(out), "--resume", "--quiet"], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "resuming on a CPU whose torch kernels are DEFAULT" in res.stderr
    assert f"the run started on {torch.backends.cpu.get_cpu_capability()}" in res.stderr
    summary = _strict(out / "summary.json")
    assert summary["rounds"] == 2 and summary["run"]["cpu"]["capability"] == "DEFAULT"
    run = summary["run"]
    assert [c["capability"] for c in run["cpu_history"]] == [torch.backends.cpu.get_cpu_capability(), "DEFAULT"]


RESUME_CHANGES = [
    (["train.lr=0.5"], "train.lr: 0.01 -> 0.5"),
    (["seed=3"], "seed: 0 -> 3"),
    (["partition.alpha=0.5"], "partition.alpha: 0.1 -> 0.5"),
    (["method=fedprox"], "method: 'fedavg' -> 'fedprox'"),
    (["method=fedprox", "options.mu=0.5"], "options.mu: '(unset)' -> 0.5"),
    (['method="fedavg+ala"'], "ala.eta: '(unset)' -> 1.0"),
    (["eval.every=2"], "eval.every: 1 -> 2"),
    (["on_nonfinite=skip"], "on_nonfinite: 'stop' -> 'skip'"),
    (["rounds=1"], "rounds: 2 -> 1 (a resumed run can only be extended)"),
]


@pytest.mark.parametrize("change,diff", RESUME_CHANGES, ids=[" ".join(c[0]) for c in RESUME_CHANGES])
def test_resume_refuses_a_changed_config_with_the_diff(tmp_path, change, diff):
    run_experiment(_cfg(), tmp_path / "r", stop_after=1)
    before = snapshot(tmp_path)
    with pytest.raises(ResumeMismatchError, match="the config differs") as e:
        run_experiment(_cfg(*change), tmp_path / "r", resume=True)
    assert diff in str(e.value)
    assert snapshot(tmp_path) == before


def test_resume_allows_more_rounds_and_runtime_only_fields(tmp_path):
    run_experiment(_cfg(), tmp_path / "r", stop_after=1)
    s = run_experiment(_cfg("rounds=3", "workers=5"), tmp_path / "r", resume=True)
    full = run_experiment(_cfg("rounds=3"), tmp_path / "full")
    assert s["rounds"] == 3 and s["best_accuracy"] == full["best_accuracy"]
    assert s["config_hash"] == full["config_hash"]  # workers is runtime-only: not in the hash


def test_overwrite_refused_and_old_run_intact_byte_for_byte(tmp_path, capsys):
    assert main(["run", *BASE, "--out", str(tmp_path / "r")]) == 0
    before = snapshot(tmp_path)
    with pytest.raises(RunExistsError, match="already holds a run"):
        run_experiment(_cfg("train.lr=0.5"), tmp_path / "r")
    assert main(["run", *BASE, "--set", "train.lr=0.5", "--out", str(tmp_path / "r")]) == 2
    assert "--resume to continue it, --force to replace it" in capsys.readouterr().err
    assert snapshot(tmp_path) == before
    (tmp_path / "r" / "stale.txt").write_text("mine")  # not a run file: --force leaves it
    assert main(["run", *BASE, "--set", "train.lr=0.5", "--set", "checkpoint_every=0", "--force",
                 "--out", str(tmp_path / "r")]) == 0
    assert not (tmp_path / "r" / "checkpoint.pt").exists()  # no file of the old run survives
    assert _strict(tmp_path / "r" / "summary.json")["run"]["config"]["train"]["lr"] == 0.5
    assert (tmp_path / "r" / "stale.txt").read_text() == "mine"


def test_default_out_dir_never_collides(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = _cfg()
    first = default_out_dir(cfg)
    assert first == Path("runs/synthetic-dirichlet-fedavg-seed0")
    run_experiment(cfg, first)
    second = default_out_dir(cfg)
    assert second == Path("runs/synthetic-dirichlet-fedavg-seed0-2")
    run_experiment(cfg, second)
    assert default_out_dir(cfg) == Path("runs/synthetic-dirichlet-fedavg-seed0-3")


def test_interrupt_after_a_round_says_how_to_resume(tmp_path, capsys, monkeypatch):
    def ctrl_c(m, sim):
        if m["round"] == 1:
            raise KeyboardInterrupt

    import fedblend.progress

    monkeypatch.setattr(fedblend.progress, "Progress", lambda total, label: ctrl_c)
    rc = main(["run", *[a for a in BASE if a != "--quiet"], "--out", str(tmp_path / "r")])
    monkeypatch.undo()
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 130 and len(err) == 1
    assert err[0] == (f"fedblend: error: interrupted after round 1; resume with: fedblend run "
                      f"{tmp_path / 'r' / 'config.toml'} --out {tmp_path / 'r'} --resume")
    assert main(["run", str(tmp_path / "r" / "config.toml"), "--out", str(tmp_path / "r"), "--resume", "--quiet",
                 "--threads", "1"]) == 0
    assert _strict(tmp_path / "r" / "summary.json")["rounds"] == 2


# ------------------------------------------------------------------------------------------------ non-finite
def _poison(fed, cid: int):
    """Client ``cid``'s training inputs made NaN: its update is NaN."""
    fed.clients[cid].train_x[:] = float("nan")


def test_nonfinite_stop_names_round_and_client(tiny_fed):
    _poison(tiny_fed, 2)
    sim = tiny_sim(tiny_fed)
    with pytest.raises(NonFiniteError, match=r"round 1: client 2's train update has NaN or inf") as e:
        sim.run()
    assert (e.value.round, e.value.client) == (1, 2)
    assert all(bool(torch.isfinite(v).all()) for v in sim.server["global"].values())  # never aggregated


def test_nonfinite_skip_aggregates_fedavg_over_the_other_clients(tiny_fed):
    _poison(tiny_fed, 2)
    sim = tiny_sim(tiny_fed, rounds=1)
    sim.on_nonfinite = "skip"
    seen = {}
    orig = sim.method.aggregate

    def spy(phase, server, replies, sctx):
        seen.update(replies)
        return orig(phase, server, replies, sctx)

    sim.method.aggregate = spy
    sim.run()
    assert sorted(seen) == [0, 1, 3]
    expected = weighted_average([seen[c].params() for c in (0, 1, 3)],
                                [seen[c].metrics["num_samples"] for c in (0, 1, 3)])
    assert all(torch.equal(sim.server["global"][k], expected[k]) for k in expected)
    assert sim.history[0]["nonfinite_clients"] == [2]
    assert sim.store.get(2) is None  # the skipped client's new state is dropped too


def test_nonfinite_policies_through_the_command(tmp_path, capsys):
    big = ["--set", "train.lr=1e30"]
    assert main(["run", *BASE, *big, "--out", str(tmp_path / "stop")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "round 1: client 0's train update has NaN or inf" in err[0]
    s = _strict(tmp_path / "stop" / "summary.json")
    assert s["status"] == "diverged" and s["nonfinite"]["round"] == 1 and s["nonfinite"]["client"] == 0
    assert s["divergence"]["round"] == 1
    rows = _strict(tmp_path / "stop" / "metrics.jsonl")
    assert rows[-1]["stopped"] == "nonfinite" and rows[-1]["nonfinite_clients"] == [0]
    # "skip" drops the NaN updates; the one finite update left (weights near 1e30) makes a global model whose
    # evaluation loss is NaN: the run diverged, it is never a result
    assert main(["run", *BASE, *big, "--set", "on_nonfinite=skip", "--out", str(tmp_path / "skip")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "round 1: the run diverged: the personalized model of 3 client(s)" in err[0], err
    s = _strict(tmp_path / "skip" / "summary.json")
    assert s["status"] == "diverged" and s["on_nonfinite"] == "skip" and s["divergence"]["round"] == 1
    assert s["nonfinite_skipped"] and all(r["clients"] for r in s["nonfinite_skipped"])
    for f in ("summary.json", "metrics.jsonl"):
        for p in (tmp_path / "stop" / f, tmp_path / "skip" / f):
            _strict(p)  # no bare NaN anywhere


# ------------------------------------------------------------------------------------------------ report
def test_report_groups_by_config_hash_and_lists_unfinished(tmp_path, capsys):
    runs = tmp_path / "runs"
    for seed, lr in [(0, 0.05), (1, 0.05), (0, 0.1), (0, 0.1)]:
        run_experiment(_cfg(f"seed={seed}", f"train.lr={lr}"), default_out_dir(_cfg(f"seed={seed}"), runs))
    run_experiment(_cfg("rounds=3", "seed=5"), runs / "unfinished", stop_after=1)
    assert main(["report", str(runs), "--out", str(tmp_path / "rep"), "--no-plots"]) == 0
    out = capsys.readouterr().out
    rows = json.loads((tmp_path / "rep" / "table.json").read_text())
    by_seeds = sorted((r["seeds"], r["duplicate_seeds"]) for r in rows)
    assert by_seeds == [([0, 0], [0]), ([0, 1], [])]  # one row per config, not "4 seeds"
    assert len({r["config_hash"] for r in rows}) == 2
    assert "warning: synthetic-dirichlet-fedavg (config" in out and "has seed(s) 0 more than once" in out
    assert f"unfinished: {runs / 'unfinished'} (unfinished, last round 1)" in out
    pending = json.loads((tmp_path / "rep" / "unfinished.json").read_text())
    assert pending == [{"dir": str(runs / "unfinished"), "status": "unfinished", "last_round": 1, "reason": ""}]


def test_report_rows_split_seeds_made_with_different_input_files(tmp_path):
    """Two seeds of one config made with different ``init`` files are two rows, two seeds with the same file one."""
    from fedblend.results.runs import group_key

    plain = tmp_path / "plain"
    run_experiment(_cfg(), plain)
    weights = tmp_path / "w.pt"
    torch.save(load_checkpoint(plain / "checkpoint.pt")["server"]["global"], weights)
    runs = tmp_path / "runs"
    for seed in (0, 1):
        run_experiment(_cfg(f'init="{weights}"', f"seed={seed}"), runs / f"a{seed}")
    torch.save({k: v * 2 for k, v in torch.load(weights).items()}, weights)
    run_experiment(_cfg(f'init="{weights}"', "seed=2"), runs / "b2")
    keys = {d.name: group_key(_strict(d / "summary.json")) for d in runs.iterdir()}
    assert keys["a0"] == keys["a1"] != keys["b2"]
    assert group_key(_strict(plain / "summary.json"))[1] == config_hash(  # runs without input files: as before
        {k: v for k, v in _strict(plain / "summary.json")["run"]["config"].items() if k != "seed"})


# ------------------------------------------------------------------------------------------------ selection
def test_select_val_picks_the_round_a_hand_made_history_says():
    history = [{"round": 1, "acc": 0.50, "val_acc": 0.40},
               {"round": 2, "acc": 0.70, "val_acc": 0.65},  # best validation
               {"round": 3, "acc": 0.80, "val_acc": 0.60},  # best test (picked on test: optimistic)
               {"round": 4, "acc": 0.60, "val_acc": 0.65}]  # ties with round 2: the first one counts
    s = selection(history, "val")
    assert (s["selected_round"], s["test_accuracy_at_best_val"], s["accuracy"]) == (2, 0.70, 0.70)
    assert (s["best_round"], s["best_accuracy"], s["final_accuracy"]) == (3, 0.80, 0.60)
    t = selection(history, "test", "final")
    assert t["accuracy"] == 0.60 and "selected_round" not in t


def test_select_val_run_records_val_metrics_and_protocol(tmp_path):
    s = run_experiment(_cfg("partition.split=train_val_test", "eval.select=val", "rounds=3",
                            "partition.min_samples=10"), tmp_path / "r")
    rows = _strict(tmp_path / "r" / "metrics.jsonl")
    assert all("val_acc" in m and "acc" in m for m in rows)
    chosen = max(rows, key=lambda m: m["val_acc"])
    assert s["selected_round"] == chosen["round"] and s["accuracy"] == chosen["acc"]
    assert "best validation accuracy" in s["protocol"]["headline"] and s["protocol"]["selection"] == "val"


# ------------------------------------------------------------------------------------------------ downloads
def test_download_lands_under_a_temporary_name_until_the_md5_matches(tmp_path):
    from fedblend.common.errors import FedblendError
    from fedblend.data.sources import ChecksumError, download_verified

    src = tmp_path / "src.bin"
    src.write_bytes(b"payload")
    dest = tmp_path / "data" / "d" / "f.bin"
    with pytest.raises(ChecksumError, match="it was discarded"):
        download_verified(src.as_uri(), dest, "0" * 32)
    assert not dest.exists() and not dest.with_suffix(".bin.part").exists()
    assert issubclass(ChecksumError, FedblendError)
    download_verified(src.as_uri(), dest, hashlib.md5(b"payload").hexdigest())
    assert dest.read_bytes() == b"payload" and not dest.with_suffix(".bin.part").exists()
