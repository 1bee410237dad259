"""Divergence is never a result.

* NaN in the state of every registered method (each client's state, and separately the server state) stops the
  run with :class:`DivergedError` under both ``on_nonfinite`` policies: the guard sees states, personalized models
  and evaluation losses, not only uploads.
* Ditto with a huge ``lam`` (personalized models NaN, never uploaded), ``on_nonfinite = "skip"`` with a round whose
  updates are all dropped, and losses that explode while staying finite (synthetic data at ``lr = 10``, MNIST at
  ``lr = 1000``) end with one error line, exit 1 and ``"status": "diverged"`` in summary.json; with
  ``on_divergence = "warn"`` the run goes on to its last round and still ends so.
* Options that mean "no training" are refused up front, naming the field.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fedblend.algorithms import METHODS
from fedblend.cli.main import main
from fedblend.common.errors import DivergedError
from fedblend.core.message import first_nonfinite_value
from tests.helpers import tiny_sim

pytestmark = pytest.mark.usefixtures("one_thread")

ALL_METHODS = [*sorted(METHODS), "fedavg+ala"]
BASE = ["--set", "dataset=synthetic", "--set", "model=mlp", "--set", "rounds=3", "--set", "partition.num_clients=3",
        "--set", "partition.min_samples=5", "--set", "checkpoint_every=1", "--set", "log.plot=false", "--quiet",
        "--threads", "1"]


def _poison(state) -> int:
    """Every floating-point tensor in ``state`` set to NaN in place; returns how many."""
    if isinstance(state, torch.Tensor):
        if state.is_floating_point():
            state.fill_(float("nan"))
            return 1
        return 0
    if isinstance(state, dict):
        return sum(_poison(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(_poison(v) for v in state)
    return 0


@pytest.mark.parametrize("where", ["client", "server"])
@pytest.mark.parametrize("policy", ["stop", "skip"])
@pytest.mark.parametrize("method", ALL_METHODS)
def test_nan_in_the_state_of_every_method_stops_the_run(tiny_fed, method, policy, where):
    sim = tiny_sim(tiny_fed, method, rounds=3)
    sim.on_nonfinite = policy
    sim.run_round()
    if where == "client":
        poisoned = sum(_poison(sim.store.get(c)) for c in list(sim.store))
        if not poisoned:
            pytest.skip(f"{method} keeps no tensor on its clients")
    else:
        if not _poison(sim.server):
            pytest.skip(f"{method} keeps no tensor on its server")
    try:
        sim.run()
    except DivergedError as e:
        assert e.round == 2, str(e)
        assert sim.next_round <= 2
        return
    # the run went on: only because the poisoned state was never read again (FedPAC's server sends every client a
    # whole new model, pFedMe's clients restart theta from what they receive); then no NaN may be left anywhere,
    # in any state or number of the run
    assert first_nonfinite_value(sim.server) is None
    assert all(first_nonfinite_value(sim.store.get(c)) is None for c in sim.store)
    assert first_nonfinite_value([{k: v for k, v in m.items() if k.endswith(("loss", "acc"))}
                                  for m in sim.history]) is None
    assert (method, where) in DEAD_STATE, f"{method}: NaN in its {where} state did not stop the run"


DEAD_STATE = {("fedpac", "client"), ("pfedme", "client")}  # the poisoned state is overwritten before it is read


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def _rows(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def _run(tmp_path, capsys, *sets: str, out: str = "run") -> tuple[int, list[str]]:
    capsys.readouterr()
    rc = main(["run", *BASE, *[a for s in sets for a in ("--set", s)], "--out", str(tmp_path / out)])
    return rc, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize("policy", ["stop", "skip"])
def test_ditto_personalized_models_nan_is_divergence(tmp_path, capsys, policy):
    """Ditto's personalized models v_k are never uploaded; with lam = 1e12 they turn NaN. The run used to report
    the share of class 0 as accuracy and end 'finished'."""
    rc, err = _run(tmp_path, capsys, "method=ditto", "options.lam=1e12", f"on_nonfinite={policy}")
    assert rc == 1 and len(err) == 1 and err[0].startswith("fedblend: error: round "), err
    assert "diverged" in err[0] or "NaN or inf" in err[0], err
    s = _summary(tmp_path / "run")
    assert s["status"] == "diverged" and s["divergence"]["round"] >= 1 and s["divergence"]["reason"]


def test_a_round_with_every_update_skipped_is_divergence(tmp_path, capsys, monkeypatch):
    """on_nonfinite = "skip" with every update of round 2 non-finite: nothing aggregated, the run diverged."""
    from fedblend.core import engine

    real = engine.Simulation._run_jobs

    def nan_in_round_2(sim, jobs):
        results = real(sim, jobs)
        for job, res in zip(jobs, results):
            if job.rnd == 1 and job.phase == "train":
                _poison(res.reply.arrays)
        return results

    monkeypatch.setattr(engine.Simulation, "_run_jobs", nan_in_round_2)
    rc, err = _run(tmp_path, capsys, "on_nonfinite=skip")
    assert rc == 1 and len(err) == 1, err
    assert "round 2: the run diverged: every train update of the round (3) was skipped as non-finite" in err[0]
    s = _summary(tmp_path / "run")
    assert s["status"] == "diverged" and s["divergence"]["round"] == 2
    assert s["nonfinite_skipped"] == [{"round": 2, "clients": [0, 1, 2]}]
    rows = _rows(tmp_path / "run")
    assert [r["round"] for r in rows] == [1, 2, 2] and rows[1]["diverged"] and rows[2]["stopped"] == "diverged"


def test_a_finite_loss_explosion_is_divergence(tmp_path, capsys):
    """lr = 10 on the synthetic data (4 classes): every loss stays finite, but round 1's test loss (171) is
    past 100 x ln 4 = 139 and round 2's train loss (about 900) past 100 x max(ln 4, round 1's 2.9): the run stops
    after round 1."""
    rc, err = _run(tmp_path, capsys, "train.lr=10")
    assert rc == 1 and len(err) == 1, err
    assert "round 1: the run diverged: the personalized models' test loss" in err[0]
    assert "exceeds the divergence bound 138.6 (divergence_factor 100 x max(ln classes" in err[0]
    s = _summary(tmp_path / "run")
    assert s["status"] == "diverged" and s["divergence"]["round"] == 1 and "test loss" in s["divergence"]["reason"]
    rows = _rows(tmp_path / "run")
    assert rows[0]["diverged"] and rows[-1] == {"round": 1, "stopped": "diverged", "reason": s["divergence"]["reason"]}
    assert all(isinstance(r.get("loss", 0.0), float) for r in rows)  # finite: nothing was NaN
    # with the test loss's bound out of reach, round 2's train loss is what stops it
    rc, err = _run(tmp_path, capsys, "train.lr=10", "divergence_factor=200", out="f200")
    assert rc == 1 and "round 2: the run diverged: the clients' mean train_loss" in err[0], err
    # a factor large enough lets the same run finish: the bound is the option's
    rc, err = _run(tmp_path, capsys, "train.lr=10", "divergence_factor=1e9", out="loose")
    assert rc == 0 and _summary(tmp_path / "loose")["status"] == "finished", err


def test_warn_goes_on_to_the_last_round_and_still_fails(tmp_path, capsys):
    rc, err = _run(tmp_path, capsys, "train.lr=10", "on_divergence=warn")
    assert rc == 1 and len(err) == 2, err
    assert err[0].startswith("fedblend: warning: round 1: the run diverged") and "goes on" in err[0]
    assert err[1].startswith("fedblend: error: round 1: the run diverged") and "went on to round 3" in err[1]
    named = err[0][err[0].index("["):err[0].index("]") + 1]  # the method (and where known the origin), as warned
    assert named.startswith("[method ") and f"{named}. It went on to round 3" in err[1], err
    s = _summary(tmp_path / "run")
    assert s["status"] == "diverged" and s["divergence"]["round"] == 1 and s["rounds"] == 3
    rows = _rows(tmp_path / "run")
    assert [r["round"] for r in rows] == [1, 2, 3] and all(r["diverged"] for r in rows)


def test_mnist_at_lr_1000_is_divergence(tmp_path, capsys, real_data_dir):
    """MNIST at lr = 1000: the losses explode (train loss ~1e6 and beyond) without a NaN; it used to end at
    chance accuracy with exit 0."""
    rc, err = _run(tmp_path, capsys, "dataset=mnist", "partition.kind=one_class", "partition.samples_per_client=40",
                   "partition.split=official", "partition.test_per_client=40",
                   "train.batch_size=20", "train.lr=1000")
    assert rc == 1 and len(err) == 1 and "the run diverged" in err[0], err
    assert _summary(tmp_path / "run")["status"] == "diverged"


NO_TRAINING = [
    (["method=fedrep", "options.head_epochs=0", "options.body_epochs=0"], "options.body_epochs must be [1, 10000], got 0"),
    (["method=fedrep", "options.body_epochs=0"], "options.body_epochs must be [1, 10000], got 0"),
    (["method=ditto", "options.personal_epochs=0"], "options.personal_epochs must be [1, 10000], got 0"),
]


@pytest.mark.parametrize("sets,match", NO_TRAINING, ids=[" ".join(c[0]) for c in NO_TRAINING])
def test_options_that_mean_no_training_are_refused(tmp_path, capsys, sets, match):
    rc, err = _run(tmp_path, capsys, *sets)
    assert rc == 2 and len(err) == 1 and match in err[0], err
    assert not (tmp_path / "run").exists()
