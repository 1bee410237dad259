"""Errors from a user's files and from the machine reach the user as one line naming the file or resource and
the fix, never a traceback (``--debug`` shows it), and leave no temporary file behind.

One parametrized test per kind of file, over the ways it can be malformed (real files on disk, written the way a
damaged or foreign file would be): a partition.json given as ``partition.path``, a PFLlib folder, a pFedRLLA
agent file (``options.agent``), a run's ``metrics.jsonl`` (``export tensorboard``, ``report``), a run's
``summary.json`` (``report``). Exit 2 (bad input). Then the machine: a full disk at every kind of file a run
writes (exit 1, the file named, "free space", no ``*.tmp`` left) and a client worker killed with SIGKILL under
``--backend processes`` (exit 1, one line saying which worker and how it died, no ``__main__`` hint).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from fedblend.cli.main import main

pytestmark = pytest.mark.usefixtures("one_thread")

SYN = ["dataset=synthetic", "model=mlp", "rounds=2", "partition.num_clients=3", "partition.min_samples=5",
       "checkpoint_every=1", "log.plot=false"]


def sets(*items: str) -> list[str]:
    return [a for item in items for a in ("--set", item)]


def one_error_line(capsys, argv: list[str], code: int, *fragments: str) -> str:
    """Run the command; assert its exit code, exactly one ``fedblend: error:`` line on stderr holding every
    fragment, and no traceback."""
    capsys.readouterr()
    rc = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == code, err
    assert len(err) == 1 and err[0].startswith("fedblend: error: "), err
    assert "Traceback" not in err[0]
    for f in fragments:
        assert f in err[0], (f, err[0])
    return err[0]


def tmp_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.endswith(".tmp")]


# ------------------------------------------------------------------------------------------ partition.json
@pytest.fixture(scope="module")
def partition_json(tmp_path_factory) -> Path:
    """A valid partition.json of the synthetic dataset (3 clients), written by ``fedblend partition``."""
    out = tmp_path_factory.mktemp("part")
    assert main(["partition", *sets(*SYN[:1], "partition.num_clients=3", "partition.min_samples=5"), "--out",
                 str(out)]) == 0
    return out / "partition.json"


def _edit(fn: Callable[[dict], object]) -> Callable[[Path], None]:
    def apply(path: Path) -> None:
        data = json.loads(path.read_text())
        fn(data)
        path.write_text(json.dumps(data))
    return apply


def _set(part: str, k: int, j: int, value) -> Callable[[dict], None]:
    def f(d):
        d["indices"][part][k][j] = value
    return f


PARTITION_JSON = {
    "truncated": (lambda p: p.write_text(p.read_text()[: len(p.read_text()) // 2]), "is not valid JSON"),
    "empty": (lambda p: p.write_text(""), "is empty"),
    "binary": (lambda p: p.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe"), "is not a text (JSON) file"),
    "a list": (lambda p: p.write_text("[1, 2, 3]"), "holds a JSON list, not an object"),
    "no indices": (_edit(lambda d: d.pop("indices")), 'has no "indices"'),
    "indices a list": (_edit(lambda d: d.update(indices=[[0, 1]])), '"indices" must be an object'),
    "out of range": (_edit(_set("train", 0, 0, 10**6)), "= 1000000: out of range"),
    "negative": (_edit(_set("train", 1, 0, -3)), "indices.train[1][0] = -3: out of range"),
    "float": (_edit(_set("train", 0, 1, 3.0)), "indices.train[0][1] = 3.0: sample indices must be integers"),
    "boolean": (_edit(_set("test", 0, 0, True)), "= True: sample indices must be integers"),
    "shared between clients": (_edit(lambda d: d["indices"]["train"][1].append(d["indices"]["train"][0][0])),
                               "is also in indices.train[0]"),
    "in train and test": (_edit(lambda d: d["indices"]["test"][0].append(d["indices"]["train"][0][0])),
                          "is also in indices.train[0]"),
    "repeated": (_edit(lambda d: d["indices"]["train"][2].append(d["indices"]["train"][2][0])), "listed twice"),
    "clients differ": (_edit(lambda d: d["indices"]["test"].pop()), "indices.test lists 2 clients"),
    "client not a list": (_edit(lambda d: d["indices"]["train"].__setitem__(0, 7)), "indices.train[0] must be a list"),
    "spec not an object": (_edit(lambda d: d.update(spec="dirichlet")), '"spec" must be an object'),
    "other dataset": (_edit(lambda d: d.update(dataset="mnist")), "is a partition of dataset 'mnist'"),
}


@pytest.mark.parametrize("kind", sorted(PARTITION_JSON))
def test_malformed_partition_json(tmp_path, capsys, partition_json, kind):
    damage, match = PARTITION_JSON[kind]
    path = tmp_path / "partition.json"
    shutil.copy(partition_json, path)
    damage(path)
    argv = ["run", *sets(*SYN, "partition.kind=indices", f"partition.path='{path}'"), "--quiet", "--out",
            str(tmp_path / "run")]
    one_error_line(capsys, argv, 2, str(path), match)
    assert not (tmp_path / "run").exists()


def test_debug_shows_the_traceback(tmp_path, partition_json):
    from fedblend.common.errors import UserFileError

    path = tmp_path / "partition.json"
    path.write_text("{")
    with pytest.raises(UserFileError, match="is not valid JSON"):
        main(["run", *sets(*SYN, "partition.kind=indices", f"partition.path='{path}'"), "--quiet", "--debug",
              "--out", str(tmp_path / "run")])


# ------------------------------------------------------------------------------------------ PFLlib folders
@pytest.fixture(scope="module")
def pflib_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pflib")
    assert main(["partition", *sets("dataset=synthetic", "partition.num_clients=3", "partition.min_samples=5"),
                 "--export", "pflib", str(out / "p")]) == 0
    return out / "p"


def _savez(**entries):
    def write(path: Path) -> None:
        with open(path, "wb") as f:
            np.savez_compressed(f, **entries)
    return write


class _Evil:
    """Unpickling this would run a shell command (what a crafted .npz can do to np.load(allow_pickle=True))."""

    def __reduce__(self):
        return (os.system, (f"touch {_Evil.marker}",))


PFLIB = {
    "garbage": (lambda p: p.write_bytes(b"not a zip file at all"), "is not a readable PFLlib client file"),
    "empty": (lambda p: p.write_bytes(b""), "is not a readable PFLlib client file"),
    "no data entry": (lambda p: _savez(x=np.zeros((2, 1, 8, 8), np.float32), y=np.zeros(2, np.int64))(p),
                      "has no 'data' entry"),
    "data not a dict": (lambda p: _savez(data=np.zeros(3))(p), "its 'data' entry is a ndarray, not a dict"),
    "no y": (lambda p: _savez(data={"x": np.zeros((2, 1, 8, 8), np.float32)})(p), "its 'data' dict has no 'y'"),
    "y not integers": (lambda p: _savez(data={"x": np.zeros((2, 1, 8, 8), np.float32), "y": np.array([0.5, 1.5])})(p),
                       "'y' must be a 1-D array of integer labels"),
    "x and y lengths": (lambda p: _savez(data={"x": np.zeros((3, 1, 8, 8), np.float32), "y": np.zeros(2, np.int64)})(p),
                        "'x' holds 3 samples but 'y' 2 labels"),
    "wrong image shape": (lambda p: _savez(data={"x": np.zeros((2, 1, 4, 4), np.float32), "y": np.zeros(2, np.int64)})(p),
                          "samples of shape (1, 4, 4), but dataset 'synthetic' has (1, 8, 8)"),
    "x not numbers": (lambda p: _savez(data={"x": np.array(["a", "b"]), "y": np.zeros(2, np.int64)})(p),
                      "'x' must be an array of numbers"),
    "foreign samples": (lambda p: _savez(data={"x": np.full((2, 1, 8, 8), 0.123, np.float32),
                                               "y": np.zeros(2, np.int64)})(p), "is not in the dataset"),
    "missing client file": (lambda p: p.unlink(), "is missing (PFLlib numbers clients"),
    "code in the pickle": (lambda p: _savez(data=np.array({"x": _Evil(), "y": np.zeros(2)}, dtype=object))(p),
                           "which is not numpy data (refused"),
}


@pytest.mark.parametrize("kind", sorted(PFLIB))
def test_malformed_pflib_folder(tmp_path, capsys, pflib_dir, kind):
    damage, match = PFLIB[kind]
    folder = tmp_path / "pflib"
    shutil.copytree(pflib_dir, folder)
    target = folder / "train" / "0.npz"
    _Evil.marker = tmp_path / "pwned"
    damage(target)
    argv = ["run", *sets(*SYN, "partition.kind=indices", f"partition.path='{folder}'"), "--quiet", "--out",
            str(tmp_path / "run")]
    one_error_line(capsys, argv, 2, str(target), match)
    assert not (tmp_path / "pwned").exists()  # nothing from the file ran
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------------------------------ agent files
AGENT_OPTS = ["method=pfedrlla", "partition.split=train_val_test", "options.random_rounds=1", "options.emb_dim=16",
              "options.factor=8", "options.hidden=32", "sampling.join_ratio=0.67"]


@pytest.fixture(scope="module")
def agent_file(tmp_path_factory) -> Path:
    """A real agent file: ``fedblend pretrain`` on the synthetic data."""
    out = tmp_path_factory.mktemp("agent")
    argv = ["pretrain", *sets(*SYN, *AGENT_OPTS), "--quiet", "--out", str(out / "agent.pt")]
    assert main(argv) == 0
    return out / "agent.pt"


def _agent_edit(fn: Callable[[dict], None]) -> Callable[[Path], None]:
    def apply(path: Path) -> None:
        from fedblend.core.checkpoint import load_checkpoint, save_checkpoint

        data = load_checkpoint(path)
        fn(data)
        save_checkpoint(path, data)
    return apply


def _first_tensor(d: dict, prefix: str) -> str:
    return next(k for k, v in d.items() if isinstance(v, torch.Tensor) and k.startswith(prefix))


AGENT = {
    "garbage": (lambda p: p.write_bytes(b"\x00garbage"), "is not a readable agent file"),
    "a run checkpoint": (_agent_edit(lambda d: d.update(format="something else")), "is not a pFedRLLA agent file"),
    "no agent": (_agent_edit(lambda d: d.pop("agent")), "has no 'agent' network"),
    "actor of the wrong shape": (_agent_edit(lambda d: d["agent"]["actor"].update(
        {_first_tensor(d["agent"]["actor"], ""): torch.zeros(3, 3)})), "does not fit this run: agent.actor."),
    "no obs_dim": (_agent_edit(lambda d: d["agent"].pop("obs_dim")), "does not fit this run: "),
    "embedding of the wrong shape": (_agent_edit(lambda d: d["embed"]["proj"][0].update(left=torch.zeros(2, 2))),
                                     "does not fit this run: proj[0].left: shape (2, 2)"),
    "embedding for another model": (_agent_edit(lambda d: d["embed"].update(shapes=[[5, 5]])),
                                    "its embedding network (kind, dim, factor, head layer matrices)"),
    "missing": (lambda p: p.unlink(), "no agent file at"),
}


@pytest.mark.parametrize("kind", sorted(AGENT))
def test_malformed_agent_file(tmp_path, capsys, agent_file, kind):
    damage, match = AGENT[kind]
    path = tmp_path / "agent.pt"
    shutil.copy(agent_file, path)
    damage(path)
    argv = ["run", *sets(*SYN, *AGENT_OPTS, f"options.agent='{path}'"), "--quiet", "--out", str(tmp_path / "run")]
    one_error_line(capsys, argv, 2, str(path), match)
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------------------------- a run's own files
@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "run"
    assert main(["run", *sets(*SYN), "--quiet", "--out", str(out)]) == 0
    return out


METRICS = {
    "cut-off last line": (lambda p: p.write_text(p.read_text()[:-40]), "line 2 of", "(cut off: was the run killed"),
    "garbage line": (lambda p: p.write_text("{\"round\": 1}\nnot json\n" + p.read_text()), "line 2 of",
                     "is not valid JSON"),
    "a list row": (lambda p: p.write_text("[1, 2]\n" + p.read_text()), "line 1 of", "holds a JSON list"),
    "binary": (lambda p: p.write_bytes(b"\xff\xfe\x00garbage\n"), "", "is not a text (JSON lines) file"),
}


@pytest.mark.parametrize("kind", sorted(METRICS))
def test_malformed_metrics_in_export_tensorboard(tmp_path, capsys, finished_run, kind):
    damage, where, match = METRICS[kind]
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    damage(run / "metrics.jsonl")
    one_error_line(capsys, ["export", "tensorboard", str(run), "--out", str(tmp_path / "tb")], 2,
                   f"{where} {run / 'metrics.jsonl'}".strip(), match, "--resume")
    assert not (tmp_path / "tb").exists()


@pytest.mark.parametrize("kind", sorted(k for k in METRICS if k != "cut-off last line"))
def test_malformed_metrics_in_report(tmp_path, capsys, finished_run, kind):
    damage, where, match = METRICS[kind]
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    damage(run / "metrics.jsonl")
    one_error_line(capsys, ["report", str(run), "--out", str(tmp_path / "rep")], 2, str(run / "metrics.jsonl"),
                   match)


def test_report_leaves_out_a_line_being_written(tmp_path, capsys, finished_run):
    """A run writing its metrics right now: the unfinished last line is not an error for ``report``."""
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    (run / "summary.json").unlink()
    (run / "metrics.jsonl").write_text((run / "metrics.jsonl").read_text()[:-40])
    assert main(["report", str(run), "--no-plots"]) == 0
    assert "last round 1" in capsys.readouterr().out


SUMMARY = {
    "not json": (lambda p: p.write_text("{\"status\": \"finished\", "), "is not valid JSON"),
    "empty": (lambda p: p.write_text(""), "is empty"),
    "a list": (lambda p: p.write_text("[]"), "holds a JSON list, not an object"),
    "binary": (lambda p: p.write_bytes(b"\x89\xff\xfe"), "is not a text (JSON) file"),
    "no accuracy": (_edit(lambda d: d.pop("best_accuracy")), "has no 'best_accuracy'"),
}


@pytest.mark.parametrize("kind", sorted(SUMMARY))
def test_malformed_summary_in_report(tmp_path, capsys, finished_run, kind):
    damage, match = SUMMARY[kind]
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    damage(run / "summary.json")
    one_error_line(capsys, ["report", str(run)], 2, str(run / "summary.json"), match, "leave")


#: summaries that parse but hold a field the table cannot use: (edit, what the skipped line says)
WRONG_FIELDS = {
    "accuracy as a string": (lambda d: d.update(best_accuracy="0.93"), "'best_accuracy' is a str ('0.93'), not a number"),
    "accuracy as a list": (lambda d: d.update(final_accuracy=[0.9]), "'final_accuracy' is a list ([0.9]), not a number"),
    "accuracy as a bool": (lambda d: d.update(best_accuracy=True), "'best_accuracy' is a bool (True), not a number"),
    "seed as a string": (lambda d: d.update(seed="0"), "'seed' is a str ('0'), not an integer"),
    "rounds as a float": (lambda d: d.update(rounds=2.5), "'rounds' is a float (2.5), not an integer"),
    "method as a number": (lambda d: d.update(method=3), "'method' is a int (3), not a string"),
    "seconds as text": (lambda d: d.update(seconds_per_round="1s"), "'seconds_per_round' is a str ('1s')"),
    "global accuracy as text": (lambda d: d.update(global_best_accuracy="x"), "'global_best_accuracy' is a str"),
    "target rounds as text": (lambda d: d.update(rounds_to_target="5"), "'rounds_to_target' is a str ('5')"),
    "run as a string": (lambda d: d.update(run="x"), "'run' is a str, not an object"),
    "no best_accuracy": (lambda d: d.pop("best_accuracy"), "has no 'best_accuracy'"),
    "no method": (lambda d: d.pop("method"), "has no 'method'"),
}


class TestReportSkipsASummaryItCannotUse:
    """A finished run whose summary.json parses but lacks a field or holds one of the wrong type is left out of
    the report with one line naming the file and the field; the other runs are reported (exit 0), never a
    traceback. Alone, it is the report's one error line (exit 2)."""

    @pytest.mark.parametrize("kind", sorted(WRONG_FIELDS))
    def test_the_rest_is_reported(self, tmp_path, capsys, finished_run, kind):
        edit, fragment = WRONG_FIELDS[kind]
        good, bad = tmp_path / "runs" / "good", tmp_path / "runs" / "bad"
        shutil.copytree(finished_run, good)
        shutil.copytree(finished_run, bad)
        _edit(edit)(bad / "summary.json")
        capsys.readouterr()
        assert main(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "rep")]) == 0
        out, err = capsys.readouterr()
        skipped = [x for x in out.splitlines() if x.startswith("skipped ")]
        assert len(skipped) == 1 and str(bad / "summary.json") in skipped[0] and fragment in skipped[0], skipped
        assert "Traceback" not in out + err and str(good) not in "".join(skipped)
        assert "| synthetic-dirichlet-fedavg |" in out and " | 1 | 2 |" in out  # the good run: 1 seed, 2 rounds
        assert fragment in (tmp_path / "rep" / "table.md").read_text()

    def test_one_line_per_skipped_run(self, tmp_path, capsys, finished_run):
        for name in ("good", "bad1", "bad2"):
            shutil.copytree(finished_run, tmp_path / "runs" / name)
        _edit(lambda d: d.update(best_accuracy="0.9"))(tmp_path / "runs" / "bad1" / "summary.json")
        _edit(lambda d: d.update(seed=None))(tmp_path / "runs" / "bad2" / "summary.json")
        capsys.readouterr()
        assert main(["report", str(tmp_path / "runs"), "--no-plots"]) == 0
        skipped = [x for x in capsys.readouterr().out.splitlines() if x.startswith("skipped ")]
        assert len(skipped) == 2 and "bad1" in skipped[0] and "'seed' is null" in skipped[1], skipped

    @pytest.mark.parametrize("kind", ["accuracy as a string", "seed as a string", "no best_accuracy"])
    def test_alone_it_is_the_one_error_line(self, tmp_path, capsys, finished_run, kind):
        edit, fragment = WRONG_FIELDS[kind]
        run = tmp_path / "run"
        shutil.copytree(finished_run, run)
        _edit(edit)(run / "summary.json")
        one_error_line(capsys, ["report", str(run)], 2, str(run / "summary.json"), fragment, "leave")


class TestTheAccuracyFigureSkipsRoundsWithoutAccuracy:
    """The run's accuracy figure over metrics rows whose accuracy is null or not a number (or whose round is not
    an integer) draws the other rounds and warns one line per round left out, never ``int * NoneType``."""

    @pytest.mark.parametrize("value", [None, "0.5", [0.5], {"acc": 0.5}], ids=["null", "str", "list", "dict"])
    def test_other_rounds_drawn(self, tmp_path, finished_run, value):
        pytest.importorskip("matplotlib")
        from fedblend.results.figures import plot_run_accuracy

        run = tmp_path / "run"
        shutil.copytree(finished_run, run)
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
        rows[0].update(acc=value, global_acc=value)
        rows.append({**rows[-1], "round": "3"})
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        with pytest.warns(RuntimeWarning) as record:
            path = plot_run_accuracy(run, tmp_path / "acc.png")
        lines = [str(w.message) for w in record if "left out of the accuracy figure" in str(w.message)]
        assert path.exists() and len(lines) == 2, lines
        assert f"round 1: acc is {value!r}, not a number" in lines[0]
        assert "row 3: round is '3', not an integer" in lines[1]


# ------------------------------------------------------------------------------------------ a full disk
def _full_at(monkeypatch, name: str) -> None:
    """The first write of a file called ``name`` fails as on a full disk (ENOSPC), as the OS reports it."""
    from fedblend.common import files

    real_write, real_append = files.write_file, files.append_text

    def write(path, data):
        if Path(path).name in (name, name + ".tmp"):
            with open(path, "wb") as f:  # a partial write, then the disk is full
                f.write(bytes(data)[:10])
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(path, data)

    def append(path, text):
        if Path(path).name == name:
            try:
                raise OSError(errno.ENOSPC, "No space left on device")
            except OSError as exc:
                raise files.WriteError(path, exc) from exc
        return real_append(path, text)

    monkeypatch.setattr(files, "write_file", write)
    monkeypatch.setattr(files, "append_text", append)


DISK_FULL = ["checkpoint.pt", "0.pt", "metrics.jsonl", "summary.json", "partition.json", "config.toml",
             "metrics.csv"]


@pytest.mark.parametrize("name", DISK_FULL)
def test_full_disk_names_the_file_and_leaves_no_temporary_file(tmp_path, capsys, monkeypatch, name):
    _full_at(monkeypatch, name)
    out = tmp_path / "run"
    line = one_error_line(capsys, ["run", *sets(*SYN, "store=disk"), "--quiet", "--out", str(out)], 1,
                          "No space left on device", "free space")
    assert f"/{name}" in line or f"/{name}.tmp" in line, line
    assert tmp_files(tmp_path) == []


def test_torch_write_failure_is_one_line(tmp_path, capsys, monkeypatch):
    """torch reports a failed write as a RuntimeError (errno lost): still one line, the fix, exit 1."""
    import fedblend.core.checkpoint as ck

    def torch_full(*args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . PytorchStreamWriter failed writing file "
                           "data/0: file write failed")

    monkeypatch.setattr(ck, "save_tensors", torch_full)  # a checkpoint without its sha256 record
    monkeypatch.setattr(ck, "tensor_bytes", torch_full)  # a run's checkpoint, serialised before it is written
    one_error_line(capsys, ["run", *sets(*SYN), "--quiet", "--out", str(tmp_path / "run")], 1,
                   "PytorchStreamWriter failed writing file", "the disk may be full")


# ------------------------------------------------------------------------------------------ a killed worker
def test_a_worker_killed_by_sigkill_is_one_line(tmp_path, capsys, monkeypatch):
    """A real SIGKILL of a client worker after round 1: one line naming the worker, its pid and SIGKILL; no hint
    about ``__main__`` (that is only for workers that fail while starting)."""
    from fedblend.core.engine import Simulation

    real = Simulation.run_round
    killed = []

    def round_then_kill(sim):
        m = real(sim)
        if not killed:
            proc = sim.backend.procs[1]
            os.kill(proc.pid, signal.SIGKILL)
            proc.join(timeout=10)
            killed.append(proc.pid)
        return m

    monkeypatch.setattr(Simulation, "run_round", round_then_kill)
    line = one_error_line(capsys, ["run", *sets(*SYN, "rounds=3"), "--backend", "processes", "--workers", "2",
                                   "--quiet", "--out", str(tmp_path / "run")], 1)
    assert f"client worker 1 (pid {killed[0]}) was killed by SIGKILL" in line and "during the run" in line
    assert "--resume" in line and "__main__" not in line
    # the checkpoint of round 1 is kept, and the run continues from it
    assert main(["run", *sets(*SYN, "rounds=3"), "--quiet", "--resume", "--out", str(tmp_path / "run")]) == 0


def test_the_crafted_pickle_would_run_code_under_a_plain_np_load(tmp_path):
    """The "code in the pickle" case is real: np.load(allow_pickle=True), what fedblend used to call, runs it."""
    _Evil.marker = tmp_path / "pwned"
    path = tmp_path / "evil.npz"
    _savez(data=np.array({"x": _Evil()}, dtype=object))(path)
    with np.load(path, allow_pickle=True) as z:
        z["data"]
    assert (tmp_path / "pwned").exists()
