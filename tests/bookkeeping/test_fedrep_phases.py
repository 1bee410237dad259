"""bookkeeping/fedrep_phases.py (docs/methods/fedrep.md, the T3 collapse): it logs each client's head and
representation phase of every round, and the run it wraps is unchanged."""

from __future__ import annotations

import json

import pytest

from fedblend.algorithms.fedrep import FedRep
from fedblend.cli.main import main
from tests.helpers import load_script

ARGS = ["--set", "dataset=synthetic", "--set", "model=mlp", "--set", "rounds=2", "--set", "partition.num_clients=3",
        "--set", "partition.min_samples=5", "--set", "method=fedrep", "--set", "options.head_epochs=1",
        "--set", "log.plot=false", "--quiet", "--threads", "1"]


@pytest.fixture
def restore_fedrep():
    original = FedRep.local_training
    yield
    FedRep.local_training = original


def _metrics(out):
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def test_phases_are_logged_per_client_and_round_and_the_run_is_unchanged(tmp_path, restore_fedrep):
    assert main(["run", *ARGS, "--out", str(tmp_path / "plain")]) == 0
    script = load_script("fedrep_phases", "bookkeeping")
    assert script.main([*ARGS, "--out", str(tmp_path / "probe")]) == 0
    rows = [json.loads(x) for x in (tmp_path / "probe" / "phases.jsonl").read_text().splitlines()]
    plain, probe = _metrics(tmp_path / "plain"), _metrics(tmp_path / "probe")
    assert [(m["acc"], m["train_loss"], m["head_loss"]) for m in probe] == \
        [(m["acc"], m["train_loss"], m["head_loss"]) for m in plain]
    expected = [(r, c, p) for r in (1, 2) for c in range(3) for p in ("head", "body")]
    assert [(x["round"], x["cid"], x["phase"]) for x in rows] == expected
    # the body phase's mean loss is what the round reports as train_loss (the mean over the 3 clients)
    for m in probe:
        body = [x["loss"] for x in rows if x["round"] == m["round"] and x["phase"] == "body"]
        assert m["train_loss"] == pytest.approx(sum(body) / 3)
    # each phase trains only its own tensors: the representation phase leaves the head (mlp: fc2) as the head
    # phase returned it and moves the body (fc1)
    assert all(x["finite"] for x in rows)
    for r, c in {(x["round"], x["cid"]) for x in rows}:
        head, body = (next(x["norms"] for x in rows if (x["round"], x["cid"], x["phase"]) == (r, c, p))
                      for p in ("head", "body"))
        assert {n for n in head if head[n] == body[n]} == {"fc2.weight", "fc2.bias"}
