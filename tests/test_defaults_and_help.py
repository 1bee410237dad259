"""Sane defaults and help: ``run`` at one thread like ``sweep``; option help from field metadata or the whole
source comment; ``configs`` descriptions that name the method and setting; a bundled config per method;
``export tensorboard`` idempotent; ``deploy``'s round display follows metrics.jsonl; library logging on the
command line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from fedblend.cli.main import main

REPO = Path(__file__).resolve().parents[1]
TINY = ["--set", "dataset='synthetic'", "--set", "model='mlp'", "--set", "rounds=2", "--set", "partition.num_clients=3",
        "--set", "partition.min_samples=5", "--set", "log.plot=false", "--quiet"]


def test_run_uses_one_thread_by_default_like_sweep(tmp_path):
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert main(["run", *TINY, "--out", str(tmp_path / "a")]) == 0
        assert json.loads((tmp_path / "a" / "summary.json").read_text())["run"]["threads"] == 1
        assert main(["run", *TINY, "--out", str(tmp_path / "b"), "--threads", "2"]) == 0
        assert json.loads((tmp_path / "b" / "summary.json").read_text())["run"]["threads"] == 2
    finally:
        torch.set_num_threads(before)


def test_option_help_is_whole_sentences_from_field_metadata(capsys):
    assert main(["methods", "ala"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    # ALA's eval_stream option has a long help: shown whole, wrapped, never cut
    assert 'learn W from the next round\'s training stream (the blend the client then trains from; learned once) or ' \
           'from this round\'s "eval" stream (earlier runs)' in text
    from dataclasses import dataclass, field

    from fedblend.cli.main import field_help
    from fedblend.common.options import opt

    @dataclass(frozen=True)
    class Opts:
        a: int = opt(1, "from opt")
        b: float = field(default=0.5, metadata={"help": "from metadata"})  # not this comment
        c: str = "x"  # a source comment is not help

    assert field_help(Opts) == {"a": "from opt", "b": "from metadata"}
    assert Opts().a == 1 and Opts(a=3).a == 3


def test_every_builtin_option_has_help_metadata():
    """Every option of every registered method and transform documents itself (what `fedblend methods NAME`
    prints and docs/config.md lists): a new option without help fails here."""
    import dataclasses

    from fedblend.algorithms.registry import METHODS, TRANSFORMS

    missing = [f"{name}.{f.name}" for reg in (METHODS, TRANSFORMS) for name, cls in reg.items()
               for f in dataclasses.fields(cls.options_cls) if not str(f.metadata.get("help", "")).strip()]
    assert missing == []


def test_configs_descriptions_name_method_and_setting_and_differ(capsys):
    assert main(["configs", "benchmarks/t1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    descs = [ln.split(None, 1)[1] for ln in lines]
    assert len(lines) == len(list((REPO / "configs" / "benchmarks").glob("t1-*.toml"))) == len(set(descs))
    by_path = dict(ln.split(None, 1) for ln in lines)
    assert by_path["configs/benchmarks/t1-fmnist-dir-fedapa-mu0.3.toml"] == \
        "FedAPA (mu=0.3): FMNIST, Dir(0.1), 20 clients (0.6-1 join), LeNet-5; 50 rounds"
    assert by_path["configs/benchmarks/t1-fmnist-pat-fedavg.toml"].startswith("FedAvg: FMNIST, 2 classes/client")
    assert not any("shared/benchmarks.md" in d for d in descs)


def test_every_method_has_a_bundled_config_that_validates():
    from fedblend.algorithms import METHODS
    from fedblend.config import check_model_fits, load_config

    missing = [n for n in sorted(METHODS) if not (REPO / "configs" / "methods" / f"{n}.toml").is_file()]
    assert not missing, f"no configs/methods/<name>.toml for {missing}: run python bookkeeping/regenerate.py"
    for name in sorted(METHODS):
        cfg = load_config(REPO / "configs" / "methods" / f"{name}.toml")
        check_model_fits(cfg.model, cfg.dataset)
        assert cfg.method == name and cfg.rounds == 50


def test_export_tensorboard_twice_gives_the_same_events_not_doubled(tmp_path, capsys):
    pytest.importorskip("tensorboard", reason="tensorboard not installed (pip install 'fedblend[tensorboard]')")
    from fedblend.tracking import read_tensorboard

    assert main(["run", *TINY, "--out", str(tmp_path / "r"), "--set", "log.tensorboard=true"]) == 0
    tb = tmp_path / "r" / "tensorboard"

    def events():
        out = {}
        for f in sorted(tb.glob("events.out.tfevents.*")):
            from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

            acc = EventAccumulator(str(f), size_guidance={"scalars": 0})
            acc.Reload()
            for tag in acc.Tags()["scalars"]:
                out.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
        return {k: sorted(v) for k, v in out.items()}

    live = events()
    assert live["acc"] and [s for s, _ in live["acc"]] == [1, 2]
    for _ in range(2):
        assert main(["export", "tensorboard", str(tmp_path / "r")]) == 0
        assert events() == live  # every point once, as the live log had it
    assert read_tensorboard(tb)["acc"].keys() == {1, 2}


def test_deploy_round_display_follows_the_metrics_the_server_writes(tmp_path, monkeypatch):
    """``flwr run`` stood in for by a script that appends rows (one line written in two pieces): the display hears
    each round once, in order, while the run is going."""
    from fedblend.flower import deploy, federation

    metrics = tmp_path / "out" / "metrics.jsonl"
    fake = tmp_path / "flwr"
    fake.write_text(f"""#!{sys.executable}
import json, time
from pathlib import Path
p = Path({str(metrics)!r}); p.parent.mkdir(parents=True, exist_ok=True)
for r in (1, 2, 3):
    line = json.dumps({{"round": r, "seconds": 0.1, "train_loss": 1.0 / r, "acc": 0.5}}) + "\\n"
    with open(p, "a") as f:
        f.write(line[:10]); f.flush(); time.sleep(0.6); f.write(line[10:])
    time.sleep(0.6)
""")
    fake.chmod(0o755)
    monkeypatch.setattr(federation, "_bin", lambda name: str(fake))
    fed = deploy.LocalFederation(tmp_path / "work")
    seen = []
    import time

    t0 = time.monotonic()
    res = fed.flwr_following("run", timeout=60, follow=metrics, on_row=lambda row, _: seen.append(
        (row["round"], time.monotonic() - t0)))
    total = time.monotonic() - t0
    assert res.returncode == 0 and [r for r, _ in seen] == [1, 2, 3]
    assert seen[0][1] < total - 1.0  # round 1 was shown while the run was still going


def test_library_logging_shows_on_the_command_line_and_quiet_hides_it(tmp_path, capsys):
    loud = [a for a in TINY if a != "--quiet"] + ["--set", "checkpoint_every=1", "--out", str(tmp_path / "a")]
    assert main(["run", *loud]) == 0
    capsys.readouterr()
    assert main(["run", *loud, "--set", "rounds=3", "--resume"]) == 0
    assert "fedblend: resuming" in capsys.readouterr().err
    assert main(["run", *loud, "--set", "rounds=4", "--resume", "--quiet"]) == 0
    assert "resuming" not in capsys.readouterr().err


def test_methods_name_lists_its_eval_model_choices_default_first(capsys):
    """``fedblend methods NAME`` shows the ``[eval] model`` choices the method offers, its default first, for every
    built-in method (as the method itself reports them)."""
    from fedblend.algorithms import METHODS
    from fedblend.algorithms.registry import build_method

    for name in sorted(METHODS):
        assert main(["methods", name]) == 0
        out = capsys.readouterr().out
        part = out[out.index("[eval] model"):]
        listed = [ln.strip().strip("'") for ln in part.splitlines()[1:] if ln.startswith("  '")]
        assert listed == list(build_method(name).eval_choices()), name
    assert main(["methods", "fedgh"]) == 0
    out = capsys.readouterr().out
    assert out.index("'header'") < out.index("'local'")
