"""Every file ``--resume`` reads is checked by content before it is used.

A run checkpointed after each of 2 rounds, then one bit flipped in one file ``--resume`` reads: ``checkpoint.pt``
(its first bytes, the middle of its tensor data, its last bytes), its sha256 record ``checkpoint.pt.sha256``,
``partition.json`` and (``store = "disk"``) a client-state file of the snapshot. Each must end in a one-line
refusal naming the file (exit 2) that changes nothing, never in a resumed run. An intact checkpoint resumes bit
for bit equal to the uninterrupted run; one without a record (an older fedblend's) resumes with a warning.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch

from fedblend.cli.main import main
from fedblend.common.codec import encode
from fedblend.config import load_config
from fedblend.core.checkpoint import load_checkpoint
from fedblend.experiment import run_experiment
from tests.helpers import without_timings

pytestmark = pytest.mark.usefixtures("one_thread")

SETS = ["dataset='synthetic'", "model='mlp'", "method='fedavg'", "rounds=4", "seed=3", "checkpoint_every=1",
        "partition.num_clients=3", "partition.min_samples=5", "train.lr=0.05", "log.plot=false"]


def _sets(store: str) -> list[str]:
    return [*SETS, f"store={store!r}"]


def _rows(out: Path) -> list[dict]:
    return without_timings([json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()])


def _tree(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """``{store: run directory}`` of a run stopped after round 2 (checkpointed after each round)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    runs = {}
    for store in ("memory", "disk"):
        out = tmp_path_factory.mktemp(store) / "run"
        run_experiment(load_config(None, _sets(store)), out, stop_after=2)
        runs[store] = out
    torch.set_num_threads(n)
    return runs


def _copy(killed, store: str, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(killed[store], out, symlinks=True)
    (out / ".fedblend.lock").unlink(missing_ok=True)
    return out


def _client_file(out: Path) -> Path:
    return sorted((out / "clients.ckpt").rglob("*.pt"))[0]


FILES = {"checkpoint.pt": lambda out: out / "checkpoint.pt",
         "checkpoint.pt.sha256": lambda out: out / "checkpoint.pt.sha256",
         "partition.json": lambda out: out / "partition.json",
         "client snapshot": _client_file}
WHERE = {"first": lambda n: 5, "middle": lambda n: n // 2, "last": lambda n: n - 1}
CASES = ([("checkpoint.pt", w, s) for w in WHERE for s in ("memory", "disk")]
         + [(f, w, "memory") for f in ("checkpoint.pt.sha256", "partition.json") for w in ("first", "middle")]
         + [("client snapshot", "middle", "disk")])


def _flip(path: Path, where: str) -> None:
    data = bytearray(path.read_bytes())
    i = WHERE[where](len(data))
    data[i] ^= 0x04
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("name,where,store", CASES, ids=[f"{f}-{w}-{s}" for f, w, s in CASES])
def test_a_flipped_bit_in_any_file_resume_reads_is_refused(killed, tmp_path, capsys, name, where, store):
    out = _copy(killed, store, tmp_path)
    target = FILES[name](out)
    _flip(target, where)
    before = _tree(out)
    args = ["run", *[a for s in _sets(store) for a in ("--set", s)], "--quiet", "--threads", "1", "--out", str(out)]
    rc = main([*args, "--resume"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2, err
    assert len(err) == 1 and err[0].startswith("fedblend: error: --resume"), err
    assert target.name in err[0] and "--force" in err[0], err
    assert _tree(out) == before  # refused: no round ran, nothing was rewritten


@pytest.mark.parametrize("store", ["memory", "disk"])
def test_an_intact_checkpoint_is_recorded_and_resumes_bit_for_bit(killed, tmp_path, store):
    out = _copy(killed, store, tmp_path)
    record = (out / "checkpoint.pt.sha256").read_text()
    assert record == hashlib.sha256((out / "checkpoint.pt").read_bytes()).hexdigest() + "  checkpoint.pt\n"
    resumed = run_experiment(load_config(None, _sets(store)), out, resume=True)
    whole = tmp_path / "whole"
    reference = run_experiment(load_config(None, _sets(store)), whole)
    assert _rows(out) == _rows(whole)
    assert resumed["best_accuracy"] == reference["best_accuracy"]
    a, b = (encode(load_checkpoint(d / "checkpoint.pt")["server"]) for d in (out, whole))  # history has timings
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) if torch.is_tensor(a[k]) else a[k] == b[k] for k in a)


def test_a_checkpoint_without_a_record_resumes_with_a_warning(killed, tmp_path):
    out = _copy(killed, "memory", tmp_path)
    (out / "checkpoint.pt.sha256").unlink()  # as an older fedblend wrote it
    with pytest.warns(RuntimeWarning, match="no recorded sha256"):
        run_experiment(load_config(None, _sets("memory")), out, resume=True)
    assert len(_rows(out)) == 4
