"""Bad inputs and faults through the ``fedblend run`` command: every case ends in exactly one
``fedblend: error: ...`` line on stderr, the documented exit code, and no results directory created or changed
(the whole test folder is compared byte for byte before and after).

One test per class of problem (config tables, method / transform options, cross-field rules, command-line
flags, files and faults, interruption), each parametrized over several cases (``len(CASES)`` in all).
"""

from __future__ import annotations

import errno
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from fedblend.cli.main import main

BASE = ["--set", "dataset=synthetic", "--set", "model=mlp", "--set", "rounds=2", "--set", "partition.num_clients=3",
        "--set", "partition.min_samples=5", "--set", "checkpoint_every=1", "--quiet", "--threads", "1"]


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root``: file contents, or None for a directory."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def expect_error(tmp_path: Path, capsys, args: list[str], match: str, code: int = 2, out: str | None = "run") -> str:
    """Run ``fedblend run BASE args --out tmp/out``; assert exit ``code``, one error line containing ``match``
    and an unchanged test folder."""
    capsys.readouterr()
    before = snapshot(tmp_path)
    rc = main(["run", *BASE, *args, *(["--out", str(tmp_path / out)] if out else [])])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == code, err
    assert len(err) == 1 and err[0].startswith("fedblend: error: "), err
    assert match in err[0], err[0]
    assert snapshot(tmp_path) == before
    return err[0]


def _sets(*items: str) -> list[str]:
    return [a for item in items for a in ("--set", item)]


# ------------------------------------------------------------------------------------------- config tables
TABLE_CASES = [
    ("sampling.join_ratio=0", "sampling.join_ratio must be (0, 1], got 0.0"),
    ("sampling.join_ratio=2.5", "sampling.join_ratio must be (0, 1], got 2.5"),
    ("sampling.low=0", "sampling.low must be (0, 1], got 0.0"),
    ("train.lr=0", "train.lr must be > 0, got 0.0"),
    ("train.lr=-0.1", "train.lr must be > 0, got -0.1"),
    ("train.lr=nan", "train.lr must be a finite number > 0, got nan"),
    ("train.lr=inf", "train.lr must be a finite number > 0, got inf"),
    ('train.lr="fast"', "train.lr must be a number, got 'fast'"),
    ("train.batch_size=0", "train.batch_size must be [1, 1000000], got 0"),
    ("train.epochs=0", "train.epochs must be [1, 10000], got 0"),
    ("train.momentum=-0.5", "train.momentum must be [0, 1), got -0.5"),
    ("train.momentum=1.0", "train.momentum must be [0, 1), got 1.0"),
    ("train.weight_decay=-1", "train.weight_decay must be >= 0, got -1.0"),
    ("eval.batch_size=0", "eval.batch_size must be [1, 1000000], got 0"),
    ("eval.every=0", "eval.every must be [1, 1000000], got 0"),
    ("eval.select=best", "eval.select must be one of ['test', 'val'], got 'best'"),
    ("partition.alpha=0", "partition.alpha must be > 0, got 0.0"),
    ("partition.num_clients=0", "partition.num_clients must be [1, 100000], got 0"),
    ("partition.train_fraction=1.0", "partition.train_fraction must be (0, 1), got 1.0"),
    ("partition.max_tries=0", "partition.max_tries must be [1, 100000], got 0"),
    ("partition.kind=voronoi", "partition.kind must be one of ['iid', 'dirichlet'"),
    ("rounds=0", "rounds must be [1, 1000000], got 0"),
    ("rounds=2.5", "rounds must be an integer, got 2.5"),
    ("seed=-1", "seed must be [0, 4294967295], got -1"),
    ("checkpoint_every=-1", "checkpoint_every must be [0, 1000000], got -1"),
    ("workers=0", "workers must be [1, 1024], got 0"),
    ("on_nonfinite=ignore", "on_nonfinite must be one of ['stop', 'skip'], got 'ignore'"),
    ("train.lrr=0.1", "unknown field train.lrr; allowed: batch_size, drop_last, epochs, lr"),
    ("colour=red", "unknown field 'colour'"),
]


@pytest.mark.parametrize("item,match", TABLE_CASES, ids=[c[0] for c in TABLE_CASES])
def test_config_table_field_out_of_range(tmp_path, capsys, item, match):
    expect_error(tmp_path, capsys, _sets(item), match)


# -------------------------------------------------------------------------------- method / transform options
OPTION_CASES = [
    (["method=fedprox", "options.mu=-1"], "options.mu must be >= 0, got -1.0"),
    (["method=fedprox", "options.mu=nan"], "options.mu must be a finite number >= 0, got nan"),
    (['method="fedavg-ft"', "options.ft_epochs=-1"], "options.ft_epochs must be [0, 10000], got -1"),
    (["method=fedapa", "options.server_momentum=1"], "options.server_momentum must be [0, 1), got 1.0"),
    (["method=fedapa", "options.mu=-0.5"], "options.mu must be >= 0, got -0.5"),
    (["method=fedapa", "options.heatmap_rounds=[1, 0]"], "options.heatmap_rounds[1] must be [1, 1000000], got 0"),
    (["method=fedalp", "options.beta=1.5"], "options.beta must be [0, 1], got 1.5"),
    (["method=fedalp", "options.t_pre_fraction=1"], "options.t_pre_fraction must be (0, 1), got 1.0"),
    (["method=fedalp", "options.num_groups=0"], "options.num_groups must be [1, 100000], got 0"),
    (['method="fedavg+ala"', "ala.s=0"], "ala.s must be (0, 100], got 0.0"),
    (['method="fedavg+ala"', "ala.p=0"], "ala.p must be [1, 1000], got 0"),
    (['method="fedavg+ala"', "ala.eta=-1"], "ala.eta must be >= 0, got -1.0"),
    (['method="fedavg+ala"', "ala.sample=all"], "ala.sample must be one of ['random', 'window'], got 'all'"),
    (['method="local+ala"'], "local has no global model and declares no personalized model its clients train from"),
    (["options.mu=0.1"], "unknown field options.mu; allowed: (none)"),
    (["ala.eta=1"], "a table for transform 'ala' needs it in method"),
    (["method=fedfoo"], "method: unknown method 'fedfoo'"),
]


@pytest.mark.parametrize("items,match", OPTION_CASES, ids=[" ".join(c[0]) for c in OPTION_CASES])
def test_method_and_transform_option_out_of_range(tmp_path, capsys, items, match):
    expect_error(tmp_path, capsys, _sets(*items), match)


# ------------------------------------------------------------------------------------------- cross-field
CROSS_CASES = [
    (["model=fasttext"], "model 'fasttext' needs text data; dataset 'synthetic' is image"),
    (["dataset=ag_news"], "model 'mlp' needs image data; dataset 'ag_news' is text"),
    (["model=lenet5"], "model 'lenet5' does not fit dataset 'synthetic' (1x8x8 images)"),
    (["model=cnn4"], "model 'cnn4' does not fit dataset 'synthetic' (1x8x8 images)"),
    (["eval.split=val"], "eval.split = 'val' needs validation data, which only partition.split = 'train_val_test'"),
    (["eval.select=val"], "eval.select = 'val' needs validation data"),
    (["partition.split=train_val_test", "eval.select=val", "eval.report=final"], "eval.report must be 'best'"),
    (["partition.split=train_val_test", "eval.select=val", "eval.split=val"], "it needs eval.split = 'test'"),
    (["partition.val_fraction=0.2"], "partition.val_fraction applies only to partition.split = 'train_val_test'"),
    (["partition.test_per_client=10"], "partition.test_per_client applies only to partition.split = 'official'"),
    (["partition.split=official", "partition.train_fraction=0.6"], "partition.train_fraction applies only to"),
    (["partition.split=train_val_test", "partition.train_fraction=0.9"],
     "partition.train_fraction + partition.val_fraction must be < 1"),
    (["sampling.scheme=uniform_range", "sampling.low=0.9", "sampling.high=0.5"], "sampling.low must be <= "
                                                                                  "sampling.high"),
    (["device=cuda", "backend=processes"], "backend = 'processes' runs on CPU only"),
]


@pytest.mark.parametrize("items,match", CROSS_CASES, ids=[" ".join(c[0]) for c in CROSS_CASES])
def test_cross_field_rule(tmp_path, capsys, items, match):
    expect_error(tmp_path, capsys, _sets(*items), match)


# ------------------------------------------------------------------------------------------- CLI flags
FLAG_CASES = [
    (["--threads", "0"], "--threads must be [1, 1024], got 0"),
    (["--threads", "-2"], "--threads must be [1, 1024], got -2"),
    (["--threads", "abc"], "argument --threads: invalid int value: 'abc'"),
    (["--workers", "0"], "workers must be [1, 1024], got 0"),
    (["--workers", "two"], "argument --workers: invalid int value: 'two'"),
    (["--device", "gpu"], "argument --device: invalid choice: 'gpu'"),
    (["--frobnicate"], "unrecognized arguments: --frobnicate"),
    (["--set", "rounds"], "--set expects key=value, got 'rounds'"),
    (["--set", "partition=5"], "partition must be a table"),
    (["--resume", "--force"], "--resume continues the run in OUT and --force replaces it"),
]


@pytest.mark.parametrize("args,match", FLAG_CASES, ids=[" ".join(c[0]) for c in FLAG_CASES])
def test_bad_command_line_flag(tmp_path, capsys, args, match):
    expect_error(tmp_path, capsys, args, match)


# ------------------------------------------------------------------------------------------- files and faults
def _no_network(monkeypatch):
    def refuse(*a, **k):
        raise urllib.error.URLError("network disabled in tests")

    monkeypatch.setattr(urllib.request, "urlopen", refuse)


def _existing_run(tmp_path: Path, capsys) -> None:
    assert main(["run", *BASE, "--out", str(tmp_path / "run")]) == 0
    capsys.readouterr()


def fault_missing_config(tmp_path, monkeypatch, capsys):
    return [str(tmp_path / "nope.toml")], "does not exist", 2


def fault_invalid_toml(tmp_path, monkeypatch, capsys):
    (tmp_path / "bad.toml").write_text("rounds = = 3\n")
    return [str(tmp_path / "bad.toml")], "invalid TOML", 2


def fault_missing_data(tmp_path, monkeypatch, capsys):
    _no_network(monkeypatch)
    (tmp_path / "data").mkdir()
    return ["--set", "dataset=mnist", "--data-dir", str(tmp_path / "data")], "dataset file", 1


def fault_corrupt_data(tmp_path, monkeypatch, capsys):
    _no_network(monkeypatch)
    (tmp_path / "data" / "mnist").mkdir(parents=True)
    (tmp_path / "data" / "mnist" / "train-images-idx3-ubyte.gz").write_bytes(b"not mnist")
    return ["--set", "dataset=mnist", "--data-dir", str(tmp_path / "data")], "has md5", 1


def fault_unreadable_data(tmp_path, monkeypatch, capsys):  # a folder where the archive should be
    (tmp_path / "data" / "mnist" / "train-images-idx3-ubyte.gz").mkdir(parents=True)
    return ["--set", "dataset=mnist", "--data-dir", str(tmp_path / "data")], "cannot read dataset 'mnist'", 1


def fault_out_is_a_file(tmp_path, monkeypatch, capsys):
    (tmp_path / "run").write_text("x")
    return [], "is a file, not a directory", 2


def fault_out_under_a_file(tmp_path, monkeypatch, capsys):
    (tmp_path / "f").write_text("x")
    return ["--out", str(tmp_path / "f" / "sub")], "cannot create or write it", 2


def fault_existing_run(tmp_path, monkeypatch, capsys):
    _existing_run(tmp_path, capsys)
    return [], "already holds a run", 2


def fault_resume_without_checkpoint(tmp_path, monkeypatch, capsys):
    return ["--resume"], "--resume: no checkpoint at", 1


def fault_corrupt_checkpoint(tmp_path, monkeypatch, capsys):
    """A checkpoint whose bytes no longer hash to the recorded sha256: refused as damaged, before it is read."""
    _existing_run(tmp_path, capsys)
    (tmp_path / "run" / "checkpoint.pt").write_bytes(b"garbage")
    return ["--resume"], "checkpoint.pt is damaged", 2


def fault_disk_full(tmp_path, monkeypatch, capsys):
    from fedblend.data.federated import FederatedData

    def full(self, path):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(FederatedData, "save", full)
    return [], "No space left on device", 1


def fault_interrupt_in_round_1(tmp_path, monkeypatch, capsys):
    from fedblend.core.engine import Simulation

    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(Simulation, "run_round", interrupted)
    return [], "interrupted before round 1 finished; nothing was kept", 130


def fault_interrupt_loading_data(tmp_path, monkeypatch, capsys):
    import fedblend.experiment as experiment

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(experiment, "load_dataset", interrupted)
    return [], "interrupted", 130


def fault_broken_pipe_in_a_round(tmp_path, monkeypatch, capsys):  # a client worker's pipe, not stdout's reader
    from fedblend.core.engine import Simulation

    def broken(self):
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    monkeypatch.setattr(Simulation, "run_round", broken)
    return [], "Broken pipe", 1


FAULTS = [fault_missing_config, fault_invalid_toml, fault_missing_data, fault_corrupt_data, fault_unreadable_data,
          fault_out_is_a_file, fault_out_under_a_file, fault_existing_run, fault_resume_without_checkpoint,
          fault_corrupt_checkpoint, fault_disk_full, fault_interrupt_in_round_1, fault_interrupt_loading_data,
          fault_broken_pipe_in_a_round]


@pytest.mark.parametrize("fault", FAULTS, ids=[f.__name__[6:] for f in FAULTS])
def test_file_and_runtime_fault(tmp_path, capsys, monkeypatch, fault):
    args, match, code = fault(tmp_path, monkeypatch, capsys)
    out = None if "--out" in args else "run"
    expect_error(tmp_path, capsys, args, match, code=code, out=out)


def test_output_to_a_closed_pipe_stops_silently_as_on_sigpipe():
    """``fedblend methods | head``: stdout's reader is gone, which is not a fault: no error line, and 141 (128 +
    SIGPIPE) as a tool killed by SIGPIPE; a broken pipe anywhere else is a fault (``broken_pipe_in_a_round``)."""
    import os
    import subprocess
    import sys

    r, w = os.pipe()
    os.close(r)
    try:
        res = subprocess.run([sys.executable, "-m", "fedblend.cli.main", "methods"], stdout=w, stderr=subprocess.PIPE,
                             text=True, timeout=120)
    finally:
        os.close(w)
    assert (res.returncode, res.stderr) == (141, "")


CASES = TABLE_CASES + OPTION_CASES + CROSS_CASES + FLAG_CASES + FAULTS


def test_case_count():
    assert len(CASES) >= 60
