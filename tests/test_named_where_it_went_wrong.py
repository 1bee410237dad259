"""A plug-in's mistake is named where it was made (#50): a NaN it produces stops the run in one line naming the
method and the hook or phase where the non-finite value first appeared; a hook that returns None is named, not the
hook that then used it; a loss term that breaks inside training is named as ``loss_terms``; a tracker that cannot
start is one line naming it, its store and the fix (or a warning with ``[log] on_error = "warn"``). Each plug-in is
one file written in ``tmp_path``, run through the command line as a researcher would."""

from __future__ import annotations

import contextlib
import io
import sys
import textwrap

import pytest

from fedblend.cli.main import main

PLUGIN = textwrap.dedent('''
    import math

    import torch

    from fedblend.algorithms.fedavg import FedAvg
    from fedblend.core.training import LossTerm


    def nan_term(params, batch):
        return next(iter(params.values())).sum() * math.nan


    def broken_term(params, batch):
        return torch.ones(2, 3) @ torch.ones(2, 3)


    class NanAggregate(FedAvg):
        name = "nan-aggregate"

        def aggregate_train(self, server, replies, sctx):
            new = super().aggregate_train(server, replies, sctx)
            glob = dict(new["global"])
            first = next(iter(glob))
            glob[first] = torch.full_like(glob[first], math.nan)
            return {**new, "global": glob}


    class NanLossTerm(FedAvg):
        name = "nan-loss-term"

        def loss_terms(self, msg, params, cstate, ctx):
            return (LossTerm(nan_term, name="nan"),)


    class BrokenLossTerm(FedAvg):
        name = "broken-loss-term"

        def loss_terms(self, msg, params, cstate, ctx):
            return (LossTerm(broken_term),)


    class NanReply(FedAvg):
        name = "nan-reply"

        def reply(self, res, msg, cstate, ctx):
            out = super().reply(res, msg, cstate, ctx)
            rec = dict(out.arrays["params"])
            first = next(iter(rec))
            rec[first] = rec[first] * math.nan
            out.arrays["params"] = rec
            return out


    class NoLossTerms(FedAvg):
        name = "no-loss-terms"

        def loss_terms(self, msg, params, cstate, ctx):
            terms = super().loss_terms(msg, params, cstate, ctx)   # forgets to return them


    class NoneBeforeTraining(FedAvg):
        name = "none-before-training"

        def before_training(self, msg, cstate, ctx):
            cstate = {**cstate, "seen": 1}   # forgets to return it
''')

RUN = ["run", "--set", "dataset=synthetic", "--set", "model=mlp", "--set", "rounds=2", "--set",
       "partition.num_clients=3", "--set", "partition.min_samples=5", "--set", "log.plot=false", "--quiet"]


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """The module name of the one-file plug-in, importable as a researcher's own module would be."""
    (tmp_path / "my_methods.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    from fedblend.algorithms.registry import METHODS

    def forget():  # this test's file, not an earlier test's (a plug-in found is registered under its path)
        sys.modules.pop("my_methods", None)
        for name in [n for n in METHODS if n.startswith("my_methods:")]:
            del METHODS[name]

    forget()
    yield "my_methods"
    forget()


def _cli(argv: list[str]) -> tuple[int, list[str]]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(argv)
    return rc, err.getvalue().splitlines()


def _run(tmp_path, method: str, *sets: str) -> tuple[int, list[str]]:
    extra = [a for s in sets for a in ("--set", s)]
    return _cli([*RUN, "--set", f"method={method}", *extra, "--out", str(tmp_path / "out")])


def _error(tmp_path, method: str, *sets: str) -> str:
    """The one line a run that fails prints (exit 1), after any warnings."""
    rc, lines = _run(tmp_path, method, *sets)
    errors = [ln for ln in lines if not ln.startswith("fedblend: warning: ")]
    assert rc == 1 and len(errors) == 1 and errors[0].startswith("fedblend: error: "), (rc, lines)
    assert not any("Traceback" in ln for ln in lines), lines
    return errors[0]


#: a plug-in's mistake -> the one line that names it (exit 1)
LINES = {
    "NanAggregate": (
        "fedblend: error: round 1: the run diverged: the server state has NaN or inf values after aggregating the "
        "train phase (in global.fc1.weight); the personalized model of 3 client(s) (client 0 first) has a NaN or "
        "inf evaluation loss on the test split; the global model of 3 client(s) (client 0 first) has a NaN or inf "
        "evaluation loss on the test split [method plug-in 'nan-aggregate' (my_methods:NanAggregate), first in its "
        "aggregate of the train phase]. It stopped (on_divergence = 'stop'): lower train.lr or the method's step "
        "sizes / regularisation weights, check the data; divergence_factor sets the loss bound, on_divergence = "
        "'warn' lets such a run go on"),
    "NanLossTerm": (
        "fedblend: error: round 1: client 0's train update has NaN or inf values (in params.fc1.weight) [method "
        "plug-in 'nan-loss-term' (my_methods:NanLossTerm), first in its loss_terms (nan): local training from "
        "finite parameters turned non-finite with them and stays finite without them]; the run stopped before "
        "aggregating it (on_nonfinite = 'stop'). Lower train.lr, check the client's data, or set on_nonfinite = "
        "'skip' to drop such updates"),
    "NanReply": (
        "fedblend: error: round 1: client 0's train update has NaN or inf values (in params.fc1.weight) [method "
        "plug-in 'nan-reply' (my_methods:NanReply), first in its reply (the model local training returned is "
        "finite)]; the run stopped before aggregating it (on_nonfinite = 'stop'). Lower train.lr, check the "
        "client's data, or set on_nonfinite = 'skip' to drop such updates"),
    "NoLossTerms": (
        "fedblend: error: method plug-in 'no-loss-terms' (my_methods:NoLossTerms): loss_terms returned None (a "
        "missing return?), not a tuple of LossTerms (client 0, round 1); a fault of its code"),
    "NoneBeforeTraining": (
        "fedblend: error: method plug-in 'none-before-training' (my_methods:NoneBeforeTraining): before_training "
        "returned None (a missing return?), not the client state (a dict) (client 0, round 1); a fault of its code"),
}


class TestTheLineNamesThePluginAndWhereItWentWrong:
    """A NaN made by ``aggregate_train``, by a loss term or by ``reply``: the method and that hook; a
    ``before_training`` that returns None: that hook, not ``client_init`` that then used the None; a
    ``loss_terms`` that returns None: that hook, not ``client_step`` whose trainer then used the None."""

    @pytest.mark.parametrize("cls", sorted(LINES))
    def test_the_exact_line(self, tmp_path, plugin, cls):
        assert _error(tmp_path, f"{plugin}:{cls}") == LINES[cls]

    def test_nan_from_a_learning_rate_names_training_not_a_hook(self, tmp_path):
        line = _error(tmp_path, "fedavg", "train.lr=1e30")
        assert "[method 'fedavg', first in local training from finite parameters (no loss terms: train.lr or " \
               "the method's step sizes)]" in line

    def test_every_update_skipped_names_where_they_turned_non_finite(self, tmp_path, plugin):
        line = _error(tmp_path, f"{plugin}:NanLossTerm", "on_nonfinite='skip'")
        assert line.startswith("fedblend: error: round 1: the run diverged: every train update of the round (3) was "
                               "skipped as non-finite (on_nonfinite = 'skip'): nothing was aggregated")
        assert "[method plug-in 'nan-loss-term' (my_methods:NanLossTerm), first in its loss_terms (nan): local " \
               "training from finite parameters turned non-finite with them and stays finite without them]. It " \
               "stopped (on_divergence = 'stop')" in line

    def test_the_warning_under_on_divergence_warn_names_it_too(self, tmp_path, plugin):
        rc, lines = _run(tmp_path, f"{plugin}:NanAggregate", "on_divergence='warn'")
        assert rc == 1 and lines[0].startswith("fedblend: warning: round 1: the run diverged: "), lines
        assert "[method plug-in 'nan-aggregate' (my_methods:NanAggregate), first in its aggregate of the train " \
               "phase]; it goes on (on_divergence = 'warn')" in lines[0], lines

    @pytest.mark.parametrize("backend", ["sequential", "vmap", "processes"])
    def test_a_loss_term_that_breaks_inside_training(self, tmp_path, plugin, backend):
        """Run by the trainer (in this process, the vmap driver or a worker), the term's failure is the hook's
        that made it (``loss_terms``, not ``client_step``), at the term's own line."""
        line = _error(tmp_path, f"{plugin}:BrokenLossTerm", f"backend={backend}")
        assert line == (
            "fedblend: error: method plug-in 'broken-loss-term' (my_methods:BrokenLossTerm) raised in loss_terms "
            "(client 0, round 1): RuntimeError: mat1 and mat2 shapes cannot be multiplied (2x3 and 2x3) (at "
            f"{tmp_path / 'my_methods.py'}:15 in broken_term); a fault of its code (fedblend --debug shows the "
            "traceback)")


class _Unwritable:
    """A TensorBoard writer whose folder cannot be written (as ``SummaryWriter`` fails on a read-only mount)."""

    def __init__(self, log_dir):
        raise PermissionError(13, "Permission denied", log_dir)


@pytest.fixture
def unwritable_tensorboard(monkeypatch):
    import fedblend.tracking.tensorboard as tb

    monkeypatch.setattr(tb, "summary_writer", lambda: _Unwritable)


class TestATrackerThatCannotStart:
    """A tracker whose construction fails is one line naming it, its store and the fix (exit 1), or, under
    ``[log] on_error = "warn"``, one warning after which the run finishes without it (exit 0)."""

    def test_an_mlflow_store_that_cannot_be_created(self, tmp_path):
        (tmp_path / "a-file").write_text("not a folder")
        uri = (tmp_path / "a-file" / "mlruns").as_uri()
        line = _error(tmp_path, "fedavg", "log.mlflow=true", f"log.mlflow_uri='{uri}'")
        assert line.startswith(f"fedblend: error: MLflow store {uri} cannot be used (")
        assert line.endswith("): fix [log] mlflow_uri (empty = a local store in OUT/mlruns), set [log] mlflow = false, "
                             "or [log] on_error = \"warn\" to run without it")

    def test_a_tensorboard_folder_that_cannot_be_written(self, tmp_path, unwritable_tensorboard):
        line = _error(tmp_path, "fedavg", "log.tensorboard=true")
        folder = tmp_path / "out" / "tensorboard"
        assert line == (
            f"fedblend: error: tensorboard tracker ({folder}) failed to start: PermissionError: [Errno 13] "
            f"Permission denied: '{folder}'; make the folder writable (or --out another directory), set [log] "
            f"tensorboard = false, or [log] on_error = \"warn\" to run without it")

    def test_on_error_warn_finishes_the_run_without_it(self, tmp_path, unwritable_tensorboard):
        rc, lines = _run(tmp_path, "fedavg", "log.tensorboard=true", "log.on_error='warn'")
        assert rc == 0 and len(lines) == 1, lines
        assert lines[0].startswith("fedblend: warning: tensorboard tracker (") and lines[0].endswith(
            "; the run goes on without it ([log] on_error = 'warn')"), lines
        assert (tmp_path / "out" / "summary.json").is_file() and not (tmp_path / "out" / "tensorboard").exists()
