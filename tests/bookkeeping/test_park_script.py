"""``bookkeeping/park.py``: a run cut by a session's end, parked in the checkout and restored on a fresh campaign
folder, resumes to the same run as one never cut; finished, too large and further-along runs are left alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fedblend.config import load_config
from fedblend.experiment import run_experiment
from tests.helpers import load_script, without_timings

pytestmark = pytest.mark.usefixtures("one_thread")

SETS = ["dataset='synthetic'", "model='mlp'", "method='fedavg'", "rounds=4", "seed=3", "checkpoint_every=1",
        "partition.num_clients=3", "partition.min_samples=5", "train.lr=0.05"]
REL = Path("runs/t4-500/x/seed0")


@pytest.fixture(scope="module")
def park():
    return load_script("park", "bookkeeping")


@pytest.fixture(scope="module")
def cut(tmp_path_factory):
    """A campaign folder whose run at :data:`REL` was stopped after round 2 of 4, with a plot and a writer lock
    file as a killed run's process leaves them."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    base = tmp_path_factory.mktemp("machine1")
    run_experiment(load_config(None, SETS), base / REL, stop_after=2)
    torch.set_num_threads(n)
    (base / REL / "accuracy.png").write_bytes(b"png")
    (base / REL / ".fedblend.lock").write_text("12345\n")
    return base


def _rows(out: Path) -> list[dict]:
    return without_timings([json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()])


def test_a_parked_cut_run_restored_elsewhere_resumes_to_the_uncut_run(park, cut, tmp_path):
    parked, fresh = tmp_path / "parked", tmp_path / "machine2"
    done = park.save(cut, parked)
    assert done["saved"] == [f"{REL} (round 2)"] and not done["too_large"]
    assert (parked / REL / "checkpoint.pt").exists() and (parked / REL / "checkpoint.pt.sha256").exists()
    assert not list((parked / REL).glob("*.png")) and not (parked / REL / ".fedblend.lock").exists()
    assert park.restore(fresh, parked)["restored"] == [f"{REL} (round 2)"]
    run_experiment(load_config(None, SETS), fresh / REL, resume=True)
    whole = run_experiment(load_config(None, SETS), tmp_path / "whole")
    assert _rows(fresh / REL) == _rows(tmp_path / "whole") and len(_rows(fresh / REL)) == 4
    assert json.loads((fresh / REL / "summary.json").read_text())["best_accuracy"] == whole["best_accuracy"]
    # the run has finished on the second machine: the next save removes its parked copy
    assert park.save(fresh, parked) == {"saved": [], "too_large": [], "removed": [str(REL)]}
    assert not (parked / REL).exists()


def test_a_run_larger_than_the_limit_is_named_not_parked(park, cut, tmp_path):
    done = park.save(cut, tmp_path / "parked", max_mb=1e-6)
    assert done["saved"] == [] and done["too_large"][0].startswith(f"{REL} (")
    assert not (tmp_path / "parked" / REL).exists()


def test_restore_keeps_a_run_that_is_finished_or_as_far_along_here(park, cut, tmp_path):
    parked = tmp_path / "parked"
    park.save(cut, parked)
    here = tmp_path / "machine2"
    (here / REL).mkdir(parents=True)
    (here / REL / "summary.json").write_text("{}")
    assert park.restore(here, parked) == {"restored": [], "kept": [str(REL)]}
    assert not (here / REL / "checkpoint.pt").exists()
    assert park.restore(cut, parked) == {"restored": [], "kept": [str(REL)]}  # the same round: nothing to copy


def test_a_finished_run_and_one_without_a_checkpoint_are_not_parked(park, tmp_path):
    base = tmp_path / "machine"
    run_experiment(load_config(None, SETS), base / "runs/done")
    run_experiment(load_config(None, [*SETS, "checkpoint_every=3"]), base / "runs/early", stop_after=2)
    assert park.cut_runs(base) == []
    assert park.save(base, tmp_path / "parked") == {"saved": [], "too_large": [], "removed": []}


def test_checkpointed_is_the_last_round_down_to_the_checkpoint_interval(park, tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / "checkpoint.pt").write_bytes(b"x")
    (run / "config.toml").write_text("rounds = 500\ncheckpoint_every = 10\n")
    (run / "metrics.jsonl").write_text("".join(json.dumps({"round": r}) + "\n" for r in range(1, 38)))
    assert park.checkpointed(run) == 30
    (run / "checkpoint.pt").unlink()
    assert park.checkpointed(run) == 0
