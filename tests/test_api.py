"""The notebook / Python API (``fedblend.run``): configs as dicts, dotted keys, dataclasses and TOML; the same
validation and messages as the command line; the returned history and per-client results; progress in a
notebook; the notebook-style example script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import fedblend
from fedblend.api import PartitionSpec, RunConfig, TrainConfig, load, make_progress, open_run
from fedblend.cli.main import main
from fedblend.common.errors import ConfigError, RunExistsError
from fedblend.testing import without_timings

REPO = Path(__file__).resolve().parents[1]
TINY = {"dataset": "synthetic", "model": "mlp", "rounds": 3, "partition": {"num_clients": 4, "min_samples": 5},
        "train": {"lr": 0.05}, "log": {"plot": False}}

pytestmark = pytest.mark.usefixtures("one_thread")


def test_dict_dotted_keys_dataclass_and_toml_give_the_same_config(tmp_path):
    toml = tmp_path / "c.toml"
    toml.write_text('dataset = "synthetic"\nmodel = "mlp"\nrounds = 3\n[partition]\nnum_clients = 4\nmin_samples = 5\n'
                    '[train]\nlr = 0.05\n[log]\nplot = false\n')
    dotted = {"dataset": "synthetic", "model": "mlp", "rounds": 3, "partition.num_clients": 4,
              "partition.min_samples": 5, "train.lr": 0.05, "log.plot": False}
    dc = RunConfig(dataset="synthetic", model="mlp", rounds=3, partition=PartitionSpec(num_clients=4, min_samples=5),
                   train=TrainConfig(lr=0.05))
    want = load(toml).resolved()
    assert load(TINY).resolved() == want and load(dotted).resolved() == want
    assert {**load(dc).resolved(), "log": want["log"]} == want
    assert load(toml, {"rounds": 5}).rounds == 5 and load(toml, ["rounds=6"]).rounds == 6
    assert load(TINY, {"train.lr": 0.1}).train.lr == 0.1 and load(TINY, {"train": {"epochs": 2}}).train.lr == 0.05


@pytest.mark.parametrize("bad,flag", [({"train": {"lrr": 0.1}}, "train.lrr=0.1"),
                                      ({"rounds": 0}, "rounds=0"),
                                      ({"method": "nosuch"}, "method='nosuch'")])
def test_a_bad_config_raises_the_message_the_cli_prints(bad, flag, capsys):
    with pytest.raises(ConfigError) as exc:
        fedblend.run({**TINY, **bad})
    assert main(["run", "--set", flag, "--dry-run"]) == 2
    assert capsys.readouterr().err == f"fedblend: error: {exc.value}\n"


def test_run_returns_summary_history_and_per_client_results_as_the_cli_writes_them(tmp_path):
    res = fedblend.run({**TINY, "method": "fedala"}, out=tmp_path / "api")
    assert main(["run", "--set", "dataset='synthetic'", "--set", "model='mlp'", "--set", "rounds=3", "--set",
                 "partition.num_clients=4", "--set", "partition.min_samples=5", "--set", "train.lr=0.05",
                 "--set", "method='fedala'", "--set", "log.plot=false", "--out", str(tmp_path / "cli"),
                 "--quiet"]) == 0
    cli = [json.loads(x) for x in (tmp_path / "cli" / "metrics.jsonl").read_text().splitlines()]
    assert without_timings(res.history) == without_timings(cli)  # same numbers (both at one thread)
    assert res.summary == json.loads((tmp_path / "api" / "summary.json").read_text())
    assert len(res.history) == 3 and res.evaluated[-1]["round"] == 3
    final = res.client_accuracies()
    pc = res.history[-1]["per_client"]
    assert final == {c: k / n for c, k, n in zip(pc["clients"], pc["correct"], pc["n"])} and len(final) == 4
    rows = res.per_client()
    assert len(rows) == 3 * 4 and rows[0] == {"round": 1, "client": 0, "correct": res.history[0]["per_client"]
                                              ["correct"][0], "n": res.history[0]["per_client"]["n"][0],
                                              "accuracy": rows[0]["correct"] / rows[0]["n"], "model": "personalized"}
    assert len(res.per_client("global")) == 12 and res.client_accuracies(2, "global")
    again = open_run(tmp_path / "api")
    assert again.history == res.history and again.config.resolved() == res.config.resolved()
    with pytest.raises(RunExistsError):
        fedblend.run(TINY, out=tmp_path / "api")


def test_client_stats_reads_each_rounds_per_client_losses_and_alas_records(tmp_path):
    res = fedblend.run({**TINY, "method": "fedala"}, out=tmp_path / "api")
    rows = res.client_stats()
    for m in res.history:
        mine = [r for r in rows if r["round"] == m["round"]]
        pc = m["stats_per_client"]
        assert [r["client"] for r in mine] == pc["clients"] == m["selected"]
        assert [r["train_loss"] for r in mine] == pc["train_loss"]
        assert sum(pc["train_loss"]) / len(pc["train_loss"]) == m["train_loss"]
    assert "ala_loss" not in rows[0] and rows[-1]["ala_loss"] is not None  # ALA learns W from round 2
    assert open_run(tmp_path / "api").client_stats() == rows


def test_run_uses_one_thread_and_restores_the_callers_setting(tmp_path):
    import torch

    seen = []
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        fedblend.run(TINY, out=tmp_path / "a", progress=lambda m, sim: seen.append(torch.get_num_threads()))
        assert seen == [1, 1, 1] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_progress_is_on_by_default_in_a_notebook(monkeypatch, tmp_path):
    import types

    from fedblend.api import NotebookProgress

    assert make_progress("auto", 3, "x") is None  # not a terminal, not a notebook (pytest captures stderr)
    shell = type("ZMQInteractiveShell", (), {})()
    monkeypatch.setitem(sys.modules, "ipykernel", types.ModuleType("ipykernel"))
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: shell))
    bars = make_progress("auto", 3, "x")
    assert isinstance(bars, NotebookProgress)
    bars.close()
    res = fedblend.run(TINY, out=tmp_path / "nb")  # the default shows bars here, and changes no number
    plain = fedblend.run(TINY, out=tmp_path / "plain", progress=False)
    assert without_timings(res.history) == without_timings(plain.history)
    with pytest.raises(ConfigError, match="progress must be"):
        make_progress("loud", 3, "x")


def test_notebook_example_builds_a_dict_runs_it_and_plots_per_client_accuracies(tmp_path):
    out = tmp_path / "nb"
    env = {**os.environ, "FEDBLEND_EXAMPLE_QUICK": "1", "FEDBLEND_EXAMPLE_OUT": str(out),
           "PYTHONPATH": os.pathsep.join(sys.path)}
    res = subprocess.run([sys.executable, str(REPO / "examples" / "notebook.py")], capture_output=True, text=True,
                         env=env, cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert (out / "per_client_accuracy.png").stat().st_size > 10_000
    assert (out / "accuracy.png").exists() and "RunResult('fedala'" in res.stdout


# ------------------------------------------------------------------------------------------------ argument types
WRONG_PATHS = [123, 1.5, ["a.toml"], b"a.toml", object()]
WRONG_BOOLS = ["no", "yes", 0, 1, None, 1.0]


def _ids(v):
    return f"{type(v).__name__}"


class TestPathArgumentsRefuseOtherKinds:
    """A path argument given a number, a list, bytes (or None where a path is required) is a TypeError naming the
    argument and what it accepts, raised before anything is read, run or written."""

    @pytest.mark.parametrize("bad", WRONG_PATHS, ids=_ids)
    @pytest.mark.parametrize("where", ["fedblend.config", "fedblend"])
    def test_load_config_path(self, bad, where):
        import importlib

        fn = importlib.import_module(where).load_config
        with pytest.raises(TypeError, match=r"load_config's path must be a path \(str or os.PathLike\) or None, got "):
            fn(bad)

    @pytest.mark.parametrize("bad", WRONG_PATHS, ids=_ids)
    def test_run_config(self, bad, tmp_path):
        with pytest.raises(TypeError, match="config must be a TOML file path"):
            fedblend.run(bad, out=tmp_path / "r")
        assert not (tmp_path / "r").exists()

    @pytest.mark.parametrize("arg", ["out", "data_dir"])
    @pytest.mark.parametrize("bad", WRONG_PATHS, ids=_ids)
    def test_run_out_and_data_dir(self, arg, bad, tmp_path, monkeypatch):
        monkeypatch.chdir(tmp_path)  # the old code ran with a wrong data_dir and wrote under ./runs
        kw = {"out": tmp_path / "r", arg: bad}
        with pytest.raises(TypeError, match=rf"^{arg} must be a path \(str or os.PathLike\) or None, got "):
            fedblend.run(TINY, **kw)
        assert list(tmp_path.iterdir()) == []

    @pytest.mark.parametrize("bad", WRONG_PATHS + [None], ids=_ids)
    def test_run_experiment_out_dir(self, bad, tmp_path, monkeypatch):
        from fedblend.experiment import run_experiment

        monkeypatch.chdir(tmp_path)
        with pytest.raises(TypeError, match=r"^out_dir must be a path \(str or os.PathLike\), got "):
            run_experiment(load(TINY), bad)
        assert list(tmp_path.iterdir()) == []

    @pytest.mark.parametrize("bad", WRONG_PATHS, ids=_ids)
    def test_run_experiment_data_dir_and_open_run(self, bad, tmp_path):
        from fedblend.experiment import run_experiment

        with pytest.raises(TypeError, match=r"^data_dir must be a path"):
            run_experiment(load(TINY), tmp_path / "r", data_dir=bad)
        assert not (tmp_path / "r").exists()
        with pytest.raises(TypeError, match=r"^out must be a path \(str or os.PathLike\), got "):
            open_run(bad)

    def test_paths_as_str_and_pathlike_still_work(self, tmp_path):
        toml = tmp_path / "c.toml"
        toml.write_text('dataset = "synthetic"\nrounds = 2\n')
        assert fedblend.load_config(toml).rounds == 2 and fedblend.load_config(str(toml)).rounds == 2
        assert fedblend.load_config(None, ("rounds=4",)).rounds == 4


class TestOverridesAreAListNotAString:
    """A string where a list of overrides is expected is refused (it used to be iterated character by
    character), and so is anything else that is not a list of strings (a dict only where the API takes one)."""

    @pytest.mark.parametrize("bad, fragment", [
        ("rounds=3", "got the string 'rounds=3' (for one override: ['rounds=3'])"),
        (3, "got int 3"),
        (["rounds=3", 5], "but it holds int 5"),
        ([b"rounds=3"], "but it holds bytes"),
        ({"rounds": 3}, "got dict"),
    ])
    def test_load_config_overrides(self, bad, fragment):
        with pytest.raises(TypeError, match="load_config's overrides must be a list of 'key=value' strings") as exc:
            fedblend.load_config(None, bad)
        assert fragment in str(exc.value)

    @pytest.mark.parametrize("bad", ["rounds=3", 3, ["rounds=3", None]], ids=_ids)
    def test_load_and_run_overrides(self, bad, tmp_path):
        with pytest.raises(TypeError, match="overrides must be a list of 'key=value' strings or a dict"):
            load(TINY, bad)
        with pytest.raises(TypeError, match="overrides must be a list of 'key=value' strings or a dict"):
            fedblend.run(TINY, out=tmp_path / "r", overrides=bad)
        assert not (tmp_path / "r").exists()


class TestBooleansAreBooleans:
    """``resume`` / ``force`` take True or False only: ``"no"`` is truthy and would resume; numbers and None are
    refused alike. ``threads`` and ``stop_after`` take ints."""

    @pytest.mark.parametrize("arg", ["resume", "force"])
    @pytest.mark.parametrize("bad", WRONG_BOOLS, ids=_ids)
    def test_run_and_run_experiment(self, arg, bad, tmp_path):
        from fedblend.experiment import run_experiment

        with pytest.raises(TypeError, match=f"^{arg} must be True or False, got "):
            fedblend.run(TINY, out=tmp_path / "a", **{arg: bad})
        with pytest.raises(TypeError, match=f"^{arg} must be True or False, got "):
            run_experiment(load(TINY), tmp_path / "b", **{arg: bad})
        assert list(tmp_path.iterdir()) == []

    @pytest.mark.parametrize("bad", ["2", 2.0, True], ids=_ids)
    def test_ints(self, bad, tmp_path):
        from fedblend.experiment import run_experiment

        with pytest.raises(TypeError, match="^threads must be an int or None"):
            fedblend.run(TINY, out=tmp_path / "a", threads=bad)
        with pytest.raises(TypeError, match="^stop_after must be an int or None"):
            run_experiment(load(TINY), tmp_path / "b", stop_after=bad)
        assert list(tmp_path.iterdir()) == []


class TestOpenRunReadsDamagedSummaries:
    """open_run over a summary.json that is not a JSON object is the one-line UserFileError naming the file; one
    whose accuracy has the wrong type still opens and prints (its repr shows the value as it is)."""

    @pytest.mark.parametrize("text, fragment", [("", "is empty"), ("{", "is not valid JSON"),
                                                ("[1]", "holds a JSON list, not an object")])
    def test_not_an_object(self, tmp_path, text, fragment):
        from fedblend.common.errors import UserFileError

        (tmp_path / "metrics.jsonl").write_text('{"round": 1, "acc": 0.5}\n')
        (tmp_path / "summary.json").write_text(text)
        with pytest.raises(UserFileError, match=fragment) as exc:
            open_run(tmp_path)
        assert str(tmp_path / "summary.json") in str(exc.value)

    @pytest.mark.parametrize("acc", ["0.93", [0.9], None, True])
    def test_wrong_accuracy_type_still_prints(self, tmp_path, acc):
        (tmp_path / "metrics.jsonl").write_text('{"round": 1, "acc": 0.5}\n')
        (tmp_path / "summary.json").write_text(json.dumps({"method": "fedavg", "seed": 0, "best_accuracy": acc}))
        assert f"best accuracy {acc!r}" in repr(open_run(tmp_path))
