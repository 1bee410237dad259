"""Range checks outside the run config: every numeric flag of every command, the values a run is capped at,
upper bounds where a value can exhaust the machine, a config changed through the Python API, and sweeps whose
runs would collide. Each refusal is one ``fedblend: error:`` line and exit 2, before anything is written."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from fedblend.cli.main import main, parser
from fedblend.common.cores import usable_cores
from fedblend.common.errors import ConfigError
from fedblend.config import load_config

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ["--set", "dataset=synthetic", "--set", "model=mlp", "--set", "rounds=1", "--set", "partition.num_clients=4",
        "--set", "partition.min_samples=5", "--set", "log.plot=false"]
# what each command needs besides the flag under test (the flag's value then decides)
REQUIRED = {"run": ["--check"], "bench": [], "pretrain": [], "deploy": ["--out", "o", "--write-app", "app"],
            "sweep": ["c.toml", "--out", "sw", "--dry-run"], "partition": [], "report": ["runs"],
            "export": ["tensorboard", "r"], "methods": [], "configs": []}


def error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fedblend: error: "), err
    return err[0]


def subcommands() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def numeric_flags() -> list[tuple[str, str, object]]:
    """(command, flag, its argparse type) for every flag of every command that takes a number."""
    out = []
    for cmd, sub in subcommands().items():
        for a in sub._actions:
            if a.option_strings and a.type is not None:
                out.append((cmd, a.option_strings[0], a.type))
    return out


def values_of(cmd: str, flag: str, value: str) -> list[str]:
    """``value`` once per number the flag takes (``report --acc-range LOW HIGH`` takes two)."""
    (action,) = [a for a in subcommands()[cmd]._actions if flag in a.option_strings]
    return [value] * (action.nargs if isinstance(action.nargs, int) else 1)


def test_every_numeric_flag_of_every_command_has_a_range():
    flags = numeric_flags()
    assert {c for c, _, _ in flags} >= {"run", "sweep", "bench", "pretrain", "deploy"}
    plain = [(c, f) for c, f, t in flags if t in (int, float) or not hasattr(t, "range")]
    assert not plain, f"flags without a range check: {plain}"
    for _, _, tp in flags:
        for bad in ("-1", "1e11", "nan", "inf", "", "x"):
            with pytest.raises(argparse.ArgumentTypeError):
                tp(bad)  # every numeric flag refuses negative, huge, non-finite and non-numbers
        assert tp("1") == 1


@pytest.mark.parametrize("cmd,flag,value", [(c, f, v) for c, f, _ in numeric_flags() for v in ("0", "-5", "1e11")]
                         + [(c, f, v) for c, f, _ in numeric_flags() if c in ("run", "bench") for v in ("nan",)])
def test_a_bad_value_of_any_flag_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch, cmd, flag, value):
    monkeypatch.chdir(tmp_path)
    if value == "0" and flag in ("--seeds", "--retries"):
        pytest.skip(f"{flag} 0 is valid")
    rc = main([cmd, *REQUIRED[cmd], flag, *values_of(cmd, flag, value)])
    assert rc == 2
    line = error_line(capsys)
    assert flag in line and ("must be" in line or "invalid" in line), line
    assert list(tmp_path.iterdir()) == []  # refused while parsing: nothing written


# ------------------------------------------------------------------------------------ the tester's cases
def test_workers_are_capped_at_the_clients_and_the_cores(tmp_path, capsys):
    from fedblend.experiment import build_data, create_simulation

    cap = min(4, usable_cores())
    assert main(["run", *TINY, "--backend", "processes", "--workers", "100", "--out", str(tmp_path / "r"),
                 "--quiet", "--threads", "1"]) == 0
    err = capsys.readouterr().err
    assert f"fedblend: warning: workers = 100 capped to {cap} (the run has 4 clients" in err
    cfg = load_config(None, [a for a in TINY if a != "--set"] + ["backend='processes'", "workers=100"])
    with pytest.warns(RuntimeWarning, match="capped"):
        sim = create_simulation(cfg, build_data(cfg))
    assert sim.backend.workers == cap


@pytest.mark.parametrize("flags,match", [
    (["--nodes", "0"], "--nodes must be [1, 64], got 0"),
    (["--timeout", "-5"], "--timeout must be (0, 604800], got -5.0"),
    (["--timeout", "nan"], "--timeout must be a finite number (0, 604800], got nan"),
    (["--min-clients", "-3"], "--min-clients must be [1, 100000], got -3"),
    (["--retries", "-1"], "--retries must be [0, 100], got -1"),
    (["--threads", "0"], "--threads must be [1, 1024], got 0"),
    (["--nodes", "5"], "--nodes 5 is more than the run's 4 clients"),
])
def test_deploy_write_app_checks_its_flags(tmp_path, capsys, flags, match):
    assert main(["deploy", *TINY, "--out", str(tmp_path / "o"), "--write-app", str(tmp_path / "app"), *flags]) == 2
    assert match in error_line(capsys)
    assert list(tmp_path.iterdir()) == []


def test_bench_refuses_zero_rounds(capsys):
    from fedblend.bench import bench

    assert main(["bench", *TINY, "--rounds", "0"]) == 2
    assert "--rounds must be [1, 10000], got 0" in error_line(capsys)
    with pytest.raises(ConfigError, match="bench rounds"):
        bench(load_config(None, [a for a in TINY if a != "--set"]), rounds=0)


@pytest.mark.parametrize("item,match", [
    ("method=pfedhn --set options.hidden=100000000000", "options.hidden must be [1, 1024], got 100000000000"),
    ("method=pfedhn --set options.n_hidden=1000", "options.n_hidden must be [0, 64]"),
    ("method=pfedrlla --set options.emb_dim=100000000000", "options.emb_dim must be [1, 1024]"),
    ("method=pfedrlla --set options.buffer=100000000000", "options.buffer must be [1, 10000000]"),
    ("method=pfedla --set options.hidden=100000000000", "options.hidden must be [1, 4096]"),
    ("partition.num_clients=100000000000", "partition.num_clients must be [1, 100000]"),
    ("rounds=100000000000", "rounds must be [1, 1000000]"),
    ("train.batch_size=100000000000", "train.batch_size must be [1, 1000000]"),
    ("train.epochs=100000000000", "train.epochs must be [1, 10000]"),
    ("eval.batch_size=100000000000", "eval.batch_size must be [1, 1000000]"),
    ("seed=100000000000", "seed must be [0, 4294967295]"),
    ("workers=100000000000", "workers must be [1, 1024]"),
])
def test_sizes_that_would_exhaust_the_machine_are_refused(tmp_path, capsys, item, match):
    sets = [a for part in item.split(" --set ") for a in ("--set", part)]
    assert main(["run", *TINY, *sets, "--out", str(tmp_path / "r"), "--check"]) == 2
    assert match in error_line(capsys)
    assert list(tmp_path.iterdir()) == []


def test_a_model_that_does_not_fit_in_memory_is_one_line(tmp_path, capsys, monkeypatch):
    from fedblend.core.engine import Simulation

    def too_big(*a, **k):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 400000000000 bytes. Error code 12 (Cannot allocate memory)")

    monkeypatch.setattr(Simulation, "create", classmethod(too_big))
    assert main(["run", *TINY, "--out", str(tmp_path / "r"), "--quiet"]) == 2
    line = error_line(capsys)
    assert "do not fit in memory" in line and "400000000000 bytes" in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("change,match", [
    (lambda c: setattr(c, "rounds", 0), "rounds must be [1, 1000000], got 0"),
    (lambda c: setattr(c.partition, "num_clients", 10**11), "partition.num_clients must be [1, 100000]"),
    (lambda c: setattr(c, "name", "../escape"), "name becomes a folder name"),
    (lambda c: setattr(c, "method", "fedfoo"), "method: unknown method 'fedfoo'"),
    (lambda c: setattr(c, "options", {"mu": -1.0}), "unknown field options.mu"),
    (lambda c: setattr(c, "train", __import__("fedblend.core.training", fromlist=["TrainConfig"]).TrainConfig(lr=-1)),
     "train.lr must be > 0, got -1.0"),
    (lambda c: setattr(c, "train", {"lr": 0.1}), "train must be a TrainConfig, got dict"),
])
def test_a_config_changed_through_the_api_is_checked_again(tmp_path, change, match):
    from fedblend.bench import bench
    from fedblend.experiment import dry_run, run_experiment

    cfg = load_config(None, [a for a in TINY if a != "--set"])
    change(cfg)
    for call in (lambda: run_experiment(cfg, tmp_path / "r"), lambda: dry_run(cfg), lambda: bench(cfg, 1)):
        with pytest.raises(ConfigError) as exc:
            call()
        assert match in str(exc.value)
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------------------ sweeps
@pytest.fixture
def tiny_config(tmp_path) -> Path:
    path = tmp_path / "c.toml"
    path.write_text('dataset = "synthetic"\nmodel = "mlp"\nrounds = 1\n[partition]\nnum_clients = 3\n'
                    'min_samples = 5\n[log]\nplot = false\n')
    return path


@pytest.mark.parametrize("args,match", [
    (["--grid", "seed=0,1", "--seeds", "5"], "--seeds 5 and 'seed=0,1' both set the seed"),
    (["--set", "seed=3", "--seeds", "1"], "--seeds 1 and 'seed=3' both set the seed"),
    (["--seeds", "1", "2", "1"], "--seeds lists seed 1 more than once"),
    (["--grid", "train.lr=0.1,1e-1"], "two sweep runs are the same run"),
    (["--grid", "seed=0,0"], "two sweep runs are the same run"),
    (["--grid", "method=fedavg,fedprox", "--grid", "options.mu=0.1,0.2"], "unknown field options.mu"),
])
def test_a_sweep_with_colliding_runs_is_refused(tmp_path, capsys, tiny_config, args, match):
    before = sorted(tmp_path.iterdir())
    for dry in ([], ["--dry-run"]):
        assert main(["sweep", str(tiny_config), *args, "--out", str(tmp_path / "sw"), *dry]) == 2
        assert match in error_line(capsys)
    assert sorted(tmp_path.iterdir()) == before  # not even the sweep folder


def test_sweep_jobs_are_capped_at_the_cores(tmp_path, capsys, tiny_config):
    cores = usable_cores()
    assert main(["sweep", str(tiny_config), "--seeds", *map(str, range(cores + 1)), "--jobs", "1024", "--out",
                 str(tmp_path / "sw"), "--no-plots"]) == 0
    captured = capsys.readouterr()
    assert f"fedblend: warning: --jobs = 1024 capped to {cores}" in captured.err
    assert f"{cores + 1} to run, {cores} at a time" in captured.out


def test_usable_cores_follow_the_affinity_not_the_machine(monkeypatch):
    """A container or taskset may allow fewer cores than the machine has: caps use the allowed ones."""
    import fedblend.common.cores as cores

    monkeypatch.setattr(cores.os, "sched_getaffinity", lambda pid: {3}, raising=False)
    monkeypatch.setattr(cores.os, "cpu_count", lambda: 64)
    assert cores.usable_cores() == 1
    monkeypatch.delattr(cores.os, "sched_getaffinity")
    assert cores.usable_cores() == 64
