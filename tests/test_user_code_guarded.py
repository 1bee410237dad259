"""Every call into code fedblend did not write is guarded (fedblend.common.guard): a plug-in method's or
transform's hooks on every runtime (in process, vmap, worker processes, Flower nodes), a plug-in's construction
and options class, a dataset plug-in's loader, a model plug-in's builder and forward, the trackers. An exception
there, or a hook that returns the wrong kind of thing, ends in ONE HookError line naming the plug-in, the hook,
the client and the round; the command exits 1 (a fault of the run, not bad input) and ``--debug`` shows the
original traceback. The planted faults are ``tests/plugin_faults.py``'s."""

from __future__ import annotations

import contextlib
import io
import pickle
import sys

import pytest

from fedblend.cli.main import main
from fedblend.common.errors import ConfigError, HookError, MessageError
from fedblend.common.guard import guarded, plugin_name, where_text
from fedblend.core.backends import ProcessBackend
from fedblend.core.vmap import VmapBackend
from tests.helpers import tiny_sim
from tests.plugin_faults import Faulty

PLUGIN = "method plug-in 'faulty-plugin' (tests.plugin_faults:Faulty)"
RUN = ["run", "--set", "method=tests.plugin_faults:Faulty", "--set", "dataset=synthetic", "--set", "model=mlp",
       "--set", "rounds=2", "--set", "partition.num_clients=3", "--set", "partition.min_samples=5",
       "--set", "log.plot=false", "--quiet"]

#: the hooks a fault is planted in for client 2 -> whether the error names that client (the server's own hooks:
#: no client; configure and configure_evaluate run on the server for one client)
RAISING = {"init_server": False, "phases": False, "configure_train": True, "aggregate_train": False,
           "configure_evaluate": True, "init_client": True, "before_training": True, "client_init": True,
           "loss_terms": True, "reply": True, "eval_params": True}


def _faulty(hook: str, fault: str = "raise", rnd: int = 0, client: int = -1) -> dict:
    return {"hook": hook, "fault": fault, "round": rnd, "client": client}


def _cli(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(argv)
    return rc, err.getvalue()


class TestAHookThatRaisesIsNamed:
    """Whichever hook raises, in whichever round and client, the error names the plug-in, that hook, the client
    (or the server) and the 1-based round; the original exception is its cause."""

    @pytest.mark.parametrize("hook", sorted(RAISING))
    def test_every_hook_in_process(self, tiny_fed, hook):
        rnd = 0 if hook in ("init_server", "init_client") else 1  # (first contact is round 1)
        sim = tiny_sim(tiny_fed, Faulty, _faulty(hook, rnd=rnd, client=2), rounds=2) if hook != "init_server" else None
        with pytest.raises(HookError) as err:
            if sim is None:
                tiny_sim(tiny_fed, Faulty, _faulty(hook), rounds=2)
            else:
                sim.run()
        e = err.value
        assert e.plugin == PLUGIN and e.hook == hook, str(e)
        if hook == "init_server":
            assert (e.round, e.client) == (None, None) and "(before round 1)" in str(e)
        else:
            assert e.round == rnd + 1 and e.client == (2 if RAISING[hook] else None), str(e)
        assert str(e).startswith(f"{PLUGIN} raised in {hook} (") and "ValueError: planted fault" in str(e)
        assert "tests/plugin_faults.py:" in str(e) and "\n" not in str(e)
        assert isinstance(e.__cause__, ValueError)

    @pytest.mark.parametrize("backend", ["vmap", "processes"])
    @pytest.mark.parametrize("hook", ["loss_terms", "reply", "init_client", "eval_params"])
    def test_the_same_under_other_backends(self, tiny_fed, hook, backend):
        """A worker process or the vmap driver reports the error; the engine raises it once, as in process."""
        made = VmapBackend() if backend == "vmap" else ProcessBackend(workers=2, threads=1)
        with tiny_sim(tiny_fed, Faulty, _faulty(hook, client=1), rounds=1, backend=made) as sim:
            with pytest.raises(HookError) as err:
                sim.run()
        assert (err.value.plugin, err.value.hook, err.value.round, err.value.client) == (PLUGIN, hook, 1, 1)

    def test_a_transform_hook_is_named_as_the_transform(self, tiny_fed):
        from fedblend.algorithms.ala import ALA

        class BrokenALA(ALA):
            def apply(self, method, params, cstate, ctx):
                raise RuntimeError("blend failed")

        sim = tiny_sim(tiny_fed, "fedavg", transforms=None, rounds=1)
        sim.method.transforms = [BrokenALA()]
        with pytest.raises(HookError, match=r"^transform plug-in 'ala' \(.*BrokenALA\) raised in apply "
                                            r"\(client \d, round 1\): RuntimeError: blend failed"):
            sim.run()


class TestWhatAHookReturnsIsChecked:
    """A hook that returns None (a forgotten ``return``) or the wrong kind of object, or a model that is not the
    model (a shape, an integer dtype, a name too many or too few), is named at that hook -- not an
    AttributeError wherever the value is first used, not a run that "finishes"."""

    @pytest.mark.parametrize("hook, fault, fragment", [
        ("init_server", "none", "init_server returned None (a missing return?), not the server state"),
        ("init_server", "shape", "init_server returned a server state whose global model is not the model's"),
        ("aggregate_train", "type", "aggregate_train returned a list, not the server state (a dict) (server, round 1)"),
        ("aggregate_train", "dtype", "has dtype torch.int64"),
        ("aggregate_train", "extra", "bogus not in the model"),
        ("aggregate_train", "missing", "missing fc1.weight"),
        ("configure_train", "none", "configure_train returned None (a missing return?), not a Message (client 0, "
                                    "round 1)"),
        ("configure_train", "shape", "configure returned a message that does not fit the model"),
        ("configure_evaluate", "type", "configure_evaluate returned a list, not a Message"),
        ("init_client", "none", "init_client returned None"),
        ("client_init", "none", "client_init returned None (a missing return?), not parameters (a dict of tensors) "
                                "(client 0, round 1)"),
        ("loss_terms", "none", "loss_terms returned None (a missing return?), not a tuple of LossTerms (client 0, "
                               "round 1)"),
        ("loss_terms", "type", "loss_terms returned a list holding a tuple, not a tuple of LossTerms"),
        ("before_training", "none", "before_training returned None (a missing return?), not the client state (a "
                                    "dict) (client 0, round 1)"),
        ("reply", "none", "reply returned None (a missing return?), not a Message (client 0, round 1)"),
        ("reply", "type", "reply returned a list, not a Message (client 0, round 1)"),
        ("eval_params", "missing", "eval_params returned parameters that are not the model's (missing fc1.weight)"),
        ("eval_params", "shape", "'fc1.weight' has shape [1], the model's is [50, 64]"),
        ("phases", "type", "phases returned a list holding a tuple, not a non-empty sequence of phase names"),
    ])
    def test_named_at_the_hook(self, tiny_fed, hook, fault, fragment):
        with pytest.raises(HookError) as err:
            tiny_sim(tiny_fed, Faulty, _faulty(hook, fault), rounds=1).run()
        assert str(err.value).startswith(PLUGIN + ": ") and fragment in str(err.value), str(err.value)

    @pytest.mark.parametrize("fault", ["shape", "dtype", "extra", "zero"])
    def test_replies_are_held_to_the_reply_contract(self, tiny_fed, fault):
        with pytest.raises(MessageError, match=r"^faulty-plugin: client \d's reply in round 1: "):
            tiny_sim(tiny_fed, Faulty, _faulty("reply", fault), rounds=1).run()

    @pytest.mark.parametrize("hook", ["reply", "eval_params", "loss_terms", "configure_train", "aggregate_train"])
    def test_a_hook_with_the_wrong_parameters(self, tiny_fed, hook):
        """A hook that takes fewer parameters than fedblend passes: the TypeError, named with the plug-in."""
        with pytest.raises((HookError, MessageError), match=r"faulty-plugin"):
            tiny_sim(tiny_fed, Faulty, _faulty(hook, "signature"), rounds=1).run()


class TestConstructionAndOptions:
    def test_an_exception_in_init_is_the_plugins_fault(self, tiny_fed):
        with pytest.raises(HookError, match=rf"^{__import__('re').escape(PLUGIN)} raised in __init__ \(before "
                                            r"round 1\): RuntimeError: planted fault"):
            tiny_sim(tiny_fed, Faulty, _faulty("__init__"), rounds=1)

    def test_a_value_error_in_init_refuses_the_options(self, tmp_path):
        """A constructor's ValueError is how it refuses the options it was given: bad input (exit 2)."""
        from fedblend.algorithms.registry import build_method

        with pytest.raises(ConfigError, match="^method: fedala already runs ALA"):
            from fedblend.config import load_config
            load_config(None, ["method=fedala+ala"])
        with pytest.raises(ValueError, match="fedala already runs ALA"):
            build_method("fedala+ala")

    def test_options_cls_that_is_not_a_dataclass(self, monkeypatch):
        from fedblend.algorithms import registry

        mod = type(sys)("fedblend_test_badopts")
        mod.Bad = type("Bad", (Faulty,), {"options_cls": dict, "name": "bad-options", "__module__": mod.__name__})
        monkeypatch.setitem(sys.modules, mod.__name__, mod)
        monkeypatch.setattr(registry, "METHODS", dict(registry.METHODS))
        with pytest.raises(HookError, match=r"^method plug-in 'bad-options' \(fedblend_test_badopts:Bad\): "
                                            r"options_cls is the class dict, not a dataclass"):
            registry.find_plugin("method", "fedblend_test_badopts:Bad")


def _raising_dataset(data_dir, download):
    raise OSError("no such archive")


def _raising_model(info):
    raise KeyError("num_classes")


class TestDatasetModelAndTrackerCallSites:
    def test_a_dataset_plugin_that_raises(self, monkeypatch):
        from fedblend.data import sources

        monkeypatch.setitem(sources.DATASETS, "broken-data", _raising_dataset)
        with pytest.raises(HookError, match=r"^dataset plug-in 'broken-data' \(tests.test_user_code_guarded:"
                                            r"_raising_dataset\) raised in load \(before round 1\): OSError: "):
            sources.load_dataset("broken-data", "/nonexistent")

    def test_a_model_plugin_that_raises(self, monkeypatch):
        from fedblend.models import zoo

        monkeypatch.setitem(zoo.MODELS, "broken-model", _raising_model)
        with pytest.raises(HookError, match=r"^model plug-in 'broken-model' .* raised in __init__ .*KeyError"):
            zoo.build_model("broken-model", {"num_classes": 3})

    def test_a_tracker_that_raises(self, tmp_path, monkeypatch):
        import fedblend.experiment as experiment

        class Exploding:
            def __call__(self, m):
                if m["round"] == 2:
                    raise ConnectionError("store unreachable")

            def close(self):
                pass

        monkeypatch.setattr(experiment, "make_trackers", lambda *a, **k: [Exploding()])
        rc, err = _cli([*RUN[:1], "--set", "method=fedavg", *RUN[3:], "--out", str(tmp_path / "r")])
        assert rc == 1 and err.count("\n") == 1, err
        assert "tracker plug-in 'TestDatasetModelAndTrackerCallSites.test_a_tracker_that_raises.<locals>.Exploding'" in err
        assert "raised in log (round 2): ConnectionError: store unreachable" in err


class TestTheCommandLine:
    """One ``fedblend: error:`` line, exit 1; ``--debug`` raises the HookError with the plug-in's exception as
    its cause (the traceback)."""

    @pytest.mark.parametrize("hook", ["__init__", "aggregate_train", "loss_terms"])
    def test_one_line_exit_1(self, tmp_path, hook):
        rc, err = _cli([*RUN, "--set", f"options.hook={hook}", "--set", 'options.fault="raise"', "--set",
                        "options.round=1", "--out", str(tmp_path / "r")])
        assert rc == 1 and err.count("\n") == 1 and err.startswith(f"fedblend: error: {PLUGIN} raised in "), err
        assert "Traceback" not in err

    def test_debug_shows_the_traceback(self, tmp_path):
        with pytest.raises(HookError) as err:
            main([*RUN, "--set", "options.hook=reply", "--set", 'options.fault="raise"', "--out",
                  str(tmp_path / "r"), "--debug"])
        assert isinstance(err.value.__cause__, ValueError) and err.value.__cause__.__traceback__ is not None


class TestWorkerProcesses:
    """Under ``backend = "processes"`` a client hook's exception is reported by the worker and named once by the
    parent (no traceback per worker); a worker whose parent is gone (SIGTERM, Ctrl-C) ends without a word."""

    def test_named_once_without_worker_tracebacks(self, tmp_path, capfd):
        rc, err = _cli([*RUN, "--set", "backend=processes", "--set", "options.hook=loss_terms", "--set",
                        'options.fault="raise"', "--out", str(tmp_path / "r")])
        captured = capfd.readouterr()
        assert rc == 1 and err.count("\n") == 1 and "raised in loss_terms (client " in err, err
        assert "Traceback" not in captured.err + captured.out

    def test_sigterm_ends_a_run_with_one_line_and_no_worker_tracebacks(self, tmp_path):
        """SIGTERM to ``fedblend run`` under worker processes: exit 130, one line saying how to resume, nothing
        from the workers (their pipes close under them)."""
        import os
        import signal
        import subprocess
        import time

        out = tmp_path / "run"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        argv = [sys.executable, "-m", "fedblend.cli.main", *RUN[:1], "--set", "method=fedavg", *RUN[3:],
                "--set", "rounds=100000", "--set", "train.epochs=5", "--set", "backend=processes", "--set",
                "checkpoint_every=1", "--out", str(out)]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not ((out / "metrics.jsonl").exists()
                                                      and (out / "metrics.jsonl").read_text().count("\n") >= 3):
                time.sleep(0.2)
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert proc.returncode == 130 and len(lines) == 1 and "--resume" in lines[0], err
        assert "Traceback" not in err and "BrokenPipeError" not in err

    def test_a_worker_whose_parent_is_gone_ends_quietly(self, tiny_fed, capfd):
        from fedblend.core.client import ClientJob

        backend = ProcessBackend(workers=2, threads=1)
        sim = tiny_sim(tiny_fed, "fedavg", rounds=1, backend=backend, epochs=20)
        sim._run_jobs([])  # start the workers
        sctx = sim.sctx(0)
        jobs = [ClientJob("train", c, 0, sim.method.configure("train", sim.server, c, sctx), None) for c in (0, 1)]
        for w, job in enumerate(jobs):  # work in flight, then the parent goes away before reading the answers
            backend.conns[w % 2].send_bytes(pickle.dumps([__import__("fedblend.core.backends", fromlist=["x"])
                                                          ._pack_job(job)]))
        for conn in backend.conns:
            conn.close()
        for proc in backend.procs:
            proc.join(timeout=60)
        codes = [p.exitcode for p in backend.procs]
        backend.procs, backend.conns = [], []
        assert codes == [0, 0] and "Traceback" not in capfd.readouterr().err


class TestFlowerNodesReportIt:
    """On a Flower node a client hook's HookError travels in the result; the server raises it (the run stops
    naming the plug-in) instead of dropping the client as a node fault."""

    def test_server_raises_what_the_node_reported(self):
        from types import SimpleNamespace

        from fedblend.core.client import ClientJob
        from fedblend.core.message import Message
        from fedblend.flower.backend import FlowerBackend

        exc = HookError("method plug-in 'x' raised in reply (client 3, round 2): ValueError: v", "method plug-in 'x'",
                        "reply", 2, 3)
        r = {"cid": 3, "ok": False, "error": f"HookError: {exc}",
             "hook_error": [str(exc), exc.plugin, exc.hook, exc.round, exc.client]}
        job = ClientJob("train", 3, 1, Message(), None)
        with pytest.raises(HookError, match=r"raised in reply \(client 3, round 2\).*\(on node 7\)$") as err:
            FlowerBackend._result(SimpleNamespace(), job, r, 7)
        assert (err.value.hook, err.value.round, err.value.client) == ("reply", 2, 3)

    def test_end_to_end_through_flower_records(self, tmp_path):
        """The Flower backend over the in-process grid of tests/test_flower.py: the node's ClientApp runs the
        plug-in's client half, the hook raises, the server stops the run naming it and the node."""
        pytest.importorskip("flwr", reason="the Flower extra is not installed")
        from tests.test_flower import flower_run, tiny_cfg

        cfg = tiny_cfg("tests.plugin_faults:Faulty", "options.hook='loss_terms'", "options.fault='raise'",
                       "options.client=1")
        with pytest.raises(HookError, match=r"raised in loss_terms \(client 1, round 1\): ValueError: planted "
                                            r"fault.*\(on node \d+\)$") as err:
            flower_run(cfg, tmp_path)
        assert (err.value.plugin, err.value.hook, err.value.round, err.value.client) == (PLUGIN, "loss_terms", 1, 1)

    def test_a_real_deploy_says_it_in_one_line(self, tmp_path, flwr_bin, monkeypatch):
        """``fedblend deploy``: a real SuperLink and 2 SuperNodes (processes) on loopback; the plug-in's
        ``loss_terms`` raises on client 1 in round 1: the command's one error line names the plug-in, the hook,
        the client and the round (what the node sent, as the ServerApp stopped on it); exit 1, nothing left
        running."""
        pytest.importorskip("flwr", reason="the Flower extra is not installed")
        import os
        from pathlib import Path

        from tests.test_flower import TINY, _children

        root = str(Path(__file__).resolve().parents[1])  # the nodes' ClientApps import tests.plugin_faults too
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])]))
        sets = [*TINY, "rounds=2", "method='tests.plugin_faults:Faulty'", "options.hook='loss_terms'",
                "options.fault='raise'", "options.client=1"]
        rc, err = _cli(["deploy", *(f"--set={s}" for s in sets), "--nodes", "2", "--timeout", "120", "--quiet",
                        "--out", str(tmp_path / "flw")])
        lines = [ln for ln in err.splitlines() if ln.startswith("fedblend: error:")]
        assert rc == 1 and len(lines) == 1, err
        assert f"HookError: {PLUGIN} raised in loss_terms (client 1, round 1): ValueError: planted fault" in lines[0]
        assert _children() == []

    def test_the_node_puts_it_in_the_result(self):
        from fedblend.flower.node import Node

        class _Node:
            def _one(self, j, keep, states):
                raise HookError("m raised in reply", "m", "reply", 1, 0)

        out = Node.handle(_Node(), [{"cid": 0}], keep=1, states=object())
        assert out[0]["ok"] is False and out[0]["hook_error"] == ["m raised in reply", "m", "reply", 1, 0]


class TestTheGuardItself:
    def test_named_errors_and_interrupts_pass_through(self):
        for exc in (MessageError("x"), KeyboardInterrupt(), MemoryError(), StopIteration()):
            with pytest.raises(type(exc)), guarded(object(), "method", "reply"):
                raise exc

    @pytest.mark.parametrize("message", ["CUDA out of memory. Tried to allocate 2.00 GiB",
                                         "[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate "
                                         "memory: you tried to allocate 1099511627776 bytes"])
    def test_running_out_of_memory_is_not_the_plugins_fault(self, message):
        """The caller names memory faults (``experiment``: "do not fit in memory"), whoever allocated last."""
        with pytest.raises(RuntimeError, match="allocate"), guarded(object(), "method", "init_server"):
            raise RuntimeError(message)

    def test_hook_error_survives_pickling(self):
        e = HookError("text", "method 'x'", "reply", 2, 3)
        back = pickle.loads(pickle.dumps(e))
        assert (str(back), back.plugin, back.hook, back.round, back.client) == ("text", "method 'x'", "reply", 2, 3)

    def test_names(self):
        from fedblend.algorithms.fedavg import FedAvg

        assert plugin_name(FedAvg(), "method") == "method 'fedavg'"
        assert plugin_name(Faulty, "method") == PLUGIN
        assert where_text(None, None) == "before round 1" and where_text(1, None) == "server, round 2"
        assert where_text(0, [1, 4]) == "clients 1, 4, round 1" and where_text(2, None, side="") == "round 3"
