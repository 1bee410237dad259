"""A checkpoint is one atomic unit: server state, client states (a disk store's snapshot) and partition switch
together, and ``--resume`` refuses files that do not belong to the checkpoint.

* A checkpoint interrupted at every file boundary (each file write, link, directory creation and rename of the
  checkpoint, the failure injected before and after the operation as a full disk, ``OSError(ENOSPC)``) leaves no
  temporary file, and the run then either resumes bit for bit equal to the uninterrupted run or is refused;
  for the memory and the disk store.
* A snapshot file deleted, added, changed or swapped, the snapshot directory gone, ``partition.json`` changed or
  deleted, or a checkpoint whose config record does not hash to its recorded hash: ``--resume`` refuses with one
  line and exit 2, and changes nothing in the run directory.
"""

from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path

import pytest

from fedblend.cli.main import main
from fedblend.common import files
from fedblend.common.errors import CheckpointError, ResumeMismatchError
from fedblend.config import load_config
from fedblend.core.checkpoint import load_checkpoint, save_checkpoint
from fedblend.core.engine import Simulation
from fedblend.experiment import run_experiment
from tests.helpers import without_timings

pytestmark = pytest.mark.usefixtures("one_thread")

SETS = ["dataset='synthetic'", "model='mlp'", "method='fedrep'", "options.head_epochs=1", "rounds=4", "seed=4",
        "checkpoint_every=1", "partition.num_clients=3", "partition.min_samples=5", "train.lr=0.05",
        "train.batch_size=16", "train.momentum=0.5", "train.optimizer_state='keep'", "log.plot=false"]
FAIL_AT_ROUND = 3  # the checkpoint after round 3 fails; the one after round 2 is in place
OPS = ("write_file", "link", "replace", "make_dir")


def _cfg(store: str):
    return load_config(None, [*SETS, f"store={store!r}"])


def _rows(out: Path) -> list[dict]:
    return without_timings([json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()])


def _tmp_files(out: Path) -> list[str]:
    return sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.name.endswith(".tmp"))


class DiskFull:
    """Fails the ``k``-th file operation (``OPS``) of the checkpoint written after round ``FAIL_AT_ROUND`` with
    ``OSError(ENOSPC)``: ``before`` the operation happens, or right ``after`` it did."""

    def __init__(self, monkeypatch, k: int, when: str):
        self.k, self.when, self.count, self.active, self.fired = k, when, 0, False, False
        for name in OPS:
            monkeypatch.setattr(files, name, self.wrap(getattr(files, name)))
        save = Simulation.save

        def watched_save(sim, path, extra=None):
            self.active = sim.next_round == FAIL_AT_ROUND
            try:
                return save(sim, path, extra)
            finally:
                self.active = False

        monkeypatch.setattr(Simulation, "save", watched_save)

    def wrap(self, op):
        def failing(*args):
            if not self.active:
                return op(*args)
            self.count += 1
            if self.count == self.k and self.when == "before":
                self.fired = True
                raise OSError(errno.ENOSPC, "No space left on device")
            result = op(*args)
            if self.count == self.k:
                self.fired = True
                raise OSError(errno.ENOSPC, "No space left on device")
            return result

        return failing


@pytest.mark.parametrize("store", ["memory", "disk"])
def test_checkpoint_interrupted_at_every_file_boundary_resumes_exactly_or_refuses(tmp_path, monkeypatch, store):
    cfg = _cfg(store)
    reference = run_experiment(cfg, tmp_path / "ref")
    want = _rows(tmp_path / "ref")
    boundaries, refused = 0, []
    for when in ("before", "after"):
        k = 0
        while True:
            k += 1
            out = tmp_path / f"{when}{k}"
            with monkeypatch.context() as mp:
                full = DiskFull(mp, k, when)
                try:
                    run_experiment(cfg, out)
                except OSError as exc:
                    assert full.fired and exc.errno == errno.ENOSPC, exc
                    assert str(out) in str(exc) and "free space" in str(exc)  # names the file and the fix
                else:
                    assert not full.fired
                    break  # k is past the last operation of a checkpoint: every boundary was tried
            boundaries += 1
            assert _tmp_files(out) == [], f"{when} operation {k}: temporary files left"
            try:
                resumed = run_experiment(cfg, out, resume=True)
            except (ResumeMismatchError, CheckpointError) as exc:
                refused.append(f"{when} operation {k}: {exc}")  # allowed by the contract; wrong results are not
                continue
            assert _rows(out) == want, f"{when} operation {k}: the resumed run differs"
            assert resumed["best_accuracy"] == reference["best_accuracy"]
            assert _tmp_files(out) == []
            if store == "disk":  # one snapshot left: the one checkpoint.pt names
                assert len(list((out / "clients.ckpt").iterdir())) == 1
    assert boundaries >= (2 * 2 if store == "memory" else 2 * 6), boundaries
    # stronger than the contract: the previous checkpoint stays whole until the new one is complete, so every
    # interrupted checkpoint resumes (from round 2 or round 3), none has to be refused
    assert refused == []


# ------------------------------------------------------------------------------------------------ refusals
def _snapshot_dir(out: Path) -> Path:
    return out / load_checkpoint(out / "checkpoint.pt")["clients"]["__disk_snapshot__"]


def tamper_delete_client_file(out: Path) -> str:
    (_snapshot_dir(out) / "1.pt").unlink()
    return "1.pt is missing"


def tamper_extra_client_file(out: Path) -> str:
    snap = _snapshot_dir(out)
    shutil.copy(snap / "0.pt", snap / "7.pt")
    return "7.pt is not part of the checkpoint"


def tamper_changed_client_file(out: Path) -> str:
    p = _snapshot_dir(out) / "2.pt"
    p.unlink()  # a hard link: replace the file rather than write through it (the live copy is the same inode)
    p.write_bytes(b"not a state")
    return "2.pt changed since the checkpoint"


def tamper_swapped_client_files(out: Path) -> str:
    snap = _snapshot_dir(out)
    (snap / "0.pt").rename(snap / "x")
    (snap / "1.pt").rename(snap / "0.pt")
    (snap / "x").rename(snap / "1.pt")
    return "changed since the checkpoint"


def tamper_snapshot_dir_missing(out: Path) -> str:
    shutil.rmtree(_snapshot_dir(out))
    return "the client-state snapshot"


def tamper_partition_changed(out: Path) -> str:
    p = out / "partition.json"
    data = json.loads(p.read_text())
    data["indices"]["train"][0], data["indices"]["train"][1] = data["indices"]["train"][1], data["indices"]["train"][0]
    p.write_text(json.dumps(data))
    return "partition.json changed since"


def tamper_partition_deleted(out: Path) -> str:
    (out / "partition.json").unlink()
    return "partition.json is missing"


def tamper_config_hash(out: Path) -> str:
    ck = load_checkpoint(out / "checkpoint.pt")
    ck["extra"]["identity"]["config_hash"] = "0" * 16
    save_checkpoint(out / "checkpoint.pt", ck, record_hash=True)  # re-recorded: the content check passes
    return "records config hash 0000000000000000"


DISK_ONLY = [tamper_delete_client_file, tamper_extra_client_file, tamper_changed_client_file,
             tamper_swapped_client_files, tamper_snapshot_dir_missing]
ANY_STORE = [tamper_partition_changed, tamper_partition_deleted, tamper_config_hash]
CASES = [(t, "disk") for t in DISK_ONLY] + [(t, s) for t in ANY_STORE for s in ("memory", "disk")]


def _tree(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("tamper,store", CASES, ids=[f"{t.__name__[7:]}-{s}" for t, s in CASES])
def test_resume_refuses_files_that_do_not_belong_to_the_checkpoint(tmp_path, capsys, tamper, store):
    out = tmp_path / "run"
    args = ["run", *[a for s in [*SETS, f"store={store!r}"] for a in ("--set", s)], "--quiet", "--threads", "1",
            "--out", str(out)]
    run_experiment(load_config(None, [*SETS, f"store={store!r}"]), out, stop_after=2)  # as a killed run leaves it
    match = tamper(out)
    before = _tree(out)
    rc = main([*args, "--resume"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2, err
    assert len(err) == 1 and err[0].startswith("fedblend: error: --resume") and match in err[0], err
    assert "--force" in err[0] or "restore" in err[0]
    assert _tree(out) == before  # a refused resume changes nothing


def test_a_live_client_file_deleted_during_the_run_stops_it(tmp_path, capsys, monkeypatch):
    """store = "disk": a client's state file that disappears mid-run is an error, never a fresh state."""
    real = Simulation.run_round

    def round_then_delete(sim):
        m = real(sim)
        if sim.next_round == 1:
            (tmp_path / "run" / "clients" / "1.pt").unlink()
        return m

    monkeypatch.setattr(Simulation, "run_round", round_then_delete)
    args = [a for s in [*SETS, "store='disk'"] for a in ("--set", s)]
    rc = main(["run", *args, "--quiet", "--threads", "1", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1, err
    assert "clients/1.pt, client 1's state, disappeared during the run" in err[0] and "--resume" in err[0]
