"""A hook that returns the wrong kind of object is named at that hook (#50): each of the 20 hooks of the method
interface (the halves' ``HOOKS`` and ``Method.HOOKS``) returning a plausible wrong type (``tests/wrong_returns.py``)
ends the run in one :class:`~fedblend.common.errors.HookError` naming the plug-in, that hook, the round, the client
(where there is one), what it returned and what the hook must return (its return annotation:
:mod:`fedblend.core.returns`) -- not the later hook or engine line that trips over the value -- on the sequential,
vmap and processes backends, and as one line with exit 1 on the command line."""

from __future__ import annotations

import contextlib
import io
import re

import pytest

from fedblend.algorithms.registry import TRANSFORMS
from fedblend.cli.main import main
from fedblend.common.errors import HookError
from fedblend.core.backends import ProcessBackend
from fedblend.core.evaluation import EvalProtocol
from fedblend.core.method import ClientHalf, Method, ServerHalf
from fedblend.core.returns import WHAT, contracts, returned
from fedblend.core.training import LossTerm
from fedblend.core.transform import ClientTransform
from fedblend.core.vmap import VmapBackend
from tests.helpers import tiny_sim
from tests.wrong_returns import WRONG, WRONG_TRANSFORM, WrongReturn, WrongTransform

PLUGIN = "method plug-in 'wrong-return' (tests.wrong_returns:WrongReturn)"
HOOKS = (*ServerHalf.HOOKS, *ClientHalf.HOOKS, *Method.HOOKS)
#: hooks called before round 1 (construction, the server's first state)
BEFORE = ("declare", "eval_models", "init_server")
#: the server half's hooks that run for no one client
NO_CLIENT = ("phases", "aggregate", "aggregate_train", *BEFORE)
CLIENT_HOOKS = ClientHalf.HOOKS


def _expected(hook: str, cid: int = 2) -> tuple[int | None, int | None, str]:
    """(1-based round, client, where text) of the planted fault: round 2, client ``cid`` (first contact and what
    runs before round 1: earlier)."""
    if hook in BEFORE:
        return None, None, "before round 1"
    rnd = 1 if hook == "init_client" else 2
    return rnd, None if hook in NO_CLIENT else cid, (f"server, round {rnd}" if hook in NO_CLIENT
                                                      else f"client {cid}, round {rnd}")


def _options(hook: str, cid: int = 2) -> dict:
    return {"hook": hook, "round": 0 if hook in ("init_client", *BEFORE) else 1, "client": cid}


def _run(fed, hook: str, backend=None, cid: int = 2) -> HookError:
    protocol = EvalProtocol(before_after=True)  # (scored_params runs where the model is scored before / after)
    with pytest.raises(HookError) as err:
        with tiny_sim(fed, WrongReturn, _options(hook, cid), rounds=2, protocol=protocol, backend=backend) as sim:
            sim.run()
    return err.value


def _check(e: HookError, hook: str, cid: int = 2) -> None:
    rnd, client, where = _expected(hook, cid)
    text = (f"{PLUGIN}: {hook} returned a {WRONG[hook][1]}, not {contracts()[hook].what} ({where}); a fault of "
            f"its code")
    assert (str(e), e.plugin, e.hook, e.round, e.client) == (text, PLUGIN, hook, rnd, client)


class TestAWrongTypeIsNamedAtTheHookThatReturnedIt:
    @pytest.mark.parametrize("hook", HOOKS)
    def test_in_process(self, tiny_fed, hook):
        _check(_run(tiny_fed, hook), hook)

    @pytest.mark.parametrize("hook", CLIENT_HOOKS)
    def test_on_the_vmap_backend(self, tiny_fed, hook):
        _check(_run(tiny_fed, hook, VmapBackend(), cid=1), hook, cid=1)

    @pytest.mark.parametrize("hook", ["client_step", "local_training", "before_training", "reply", "evaluate"])
    def test_in_worker_processes(self, tiny_fed, hook):
        """The worker names it; the HookError travels back whole and the engine raises it once."""
        _check(_run(tiny_fed, hook, ProcessBackend(workers=2, threads=1), cid=1), hook, cid=1)

    def test_on_flower_nodes(self, tmp_path):
        """The node's ClientApp names it; the HookError travels in the client's result and the server raises it
        (tests/test_flower.py's in-process grid)."""
        pytest.importorskip("flwr", reason="the Flower extra is not installed")
        from tests.test_flower import flower_run, tiny_cfg

        cfg = tiny_cfg("tests.wrong_returns:WrongReturn", "options.hook='before_training'", "options.client=1")
        with pytest.raises(HookError, match=r"^method plug-in 'wrong-return' \(tests.wrong_returns:WrongReturn\): "
                                            r"before_training returned a tuple, not the client state \(a dict\) "
                                            r"\(client 1, round 1\); a fault of its code \(on node \d+\)$") as err:
            flower_run(cfg, tmp_path)
        assert (err.value.hook, err.value.round, err.value.client) == ("before_training", 1, 1)

    @pytest.mark.parametrize("backend", ["sequential", "vmap", "processes"])
    def test_one_line_exit_1_on_the_command_line(self, tmp_path, backend):
        err = io.StringIO()
        argv = ["run", "--set", "method=tests.wrong_returns:WrongReturn", "--set", "dataset=synthetic", "--set",
                "model=mlp", "--set", "rounds=2", "--set", "partition.num_clients=3", "--set",
                "partition.min_samples=5", "--set", "log.plot=false", "--set", f"backend={backend}", "--set",
                "options.hook='loss_terms'", "--set", "options.round=1", "--set", "options.client=1", "--quiet",
                "--out", str(tmp_path / "run")]
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = main(argv)
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip() and not ln.startswith("fedblend: warning:")]
        assert rc == 1 and lines == [f"fedblend: error: {PLUGIN}: loss_terms returned a dict, not a tuple of "
                                     f"LossTerms (client 1, round 2); a fault of its code"]


class TestTheContracts:
    """One table, read from the hooks' return annotations: every hook has one, worded for its type."""

    def test_every_hook_has_a_contract_and_a_wrong_value_tried(self):
        assert set(contracts()) == set(HOOKS) == set(WRONG) and len(HOOKS) == 20

    def test_every_annotation_is_worded(self):
        written = {getattr(Method, h).__annotations__["return"] for h in HOOKS}
        assert written <= set(WHAT), written - set(WHAT)

    def test_what_the_contract_allows(self):
        """The right types pass as they are (a list where a tuple is annotated: a sequence; a dict subclass), and
        a sequence's elements are checked too."""
        m = Method()
        for hook, value in [("loss_terms", [LossTerm(lambda p, b: 0)]), ("loss_terms", ()), ("phases", ["train"]),
                            ("init_client", {}), ("client_init", type("P", (dict,), {})())]:
            assert returned(m, hook, value, 0, 1) is value
        for hook, value, got in [("phases", (), "a tuple holding nothing"), ("phases", "train", "a str"),
                                 ("loss_terms", (LossTerm(lambda p, b: 0), None), "a tuple holding None"),
                                 ("declare", None, "None (a missing return?)"),
                                 ("eval_models", [("trained", "its model")], "a list")]:  # (dict() took it before)
            with pytest.raises(HookError, match=rf"^method 'method': {hook} returned {re.escape(got)}, not "):
                returned(m, hook, value, 0, 1)


class TestAGeneratorsReturnValue:
    """``client_step`` and ``local_training`` are generators: their final value is checked too."""

    def test_local_training_that_forgets_the_state(self, tiny_fed):
        class ForgetsState(Method):
            name = "forgets-state"

            def local_training(self, params, msg, cstate, ctx):
                res, _ = yield from super().local_training(params, msg, cstate, ctx)
                return res

        with pytest.raises(HookError, match=r"^method plug-in 'forgets-state' \(.*\): local_training returned a "
                                            r"generator whose return value is a TrainResult, not \(TrainResult, "
                                            r"state\) \(client \d, round 1\)"):
            tiny_sim(tiny_fed, ForgetsState, rounds=1).run()

    def test_client_step_whose_reply_is_no_message(self, tiny_fed):
        class BareReply(Method):
            name = "bare-reply"

            def client_step(self, phase, msg, cstate, ctx):
                reply, cstate = yield from super().client_step(phase, msg, cstate, ctx)
                return reply.params(), cstate

        with pytest.raises(HookError, match=r"client_step returned a generator whose return value is \(a dict, a "
                                            r"dict\), not \(Message, state\) \(client \d, round 1\)"):
            tiny_sim(tiny_fed, BareReply, rounds=1).run()


def test_a_none_from_the_plugins_own_helper_is_named_where_it_was_returned(tiny_fed):
    """Inside a plug-in's own code (no contract between): ``personalized_params`` using what its own helper
    returned, None, names the helper (``fedblend.common.guard``'s reading of the failing statement)."""
    class OwnCall(Method):
        name = "own-call"

        def own_model(self, cstate):
            cstate.get("params")  # a missing return

        def personalized_params(self, msg, cstate, ctx):
            params = self.own_model(cstate)
            return dict(params.items())

    with pytest.raises(HookError, match=r"own-call.*: own_model returned None \(a missing return\?\) .*, and "
                                        r"personalized_params failed on it: AttributeError"):
        tiny_sim(tiny_fed, OwnCall, rounds=1).run()


class TestATransformsWrongTypeIsNamedAtItsHook:
    """A client transform plug-in's hooks (``ClientTransform.HOOKS``) are checked as a method's are: the error
    names the transform, the hook, what it returned and what it must return."""

    TRANSFORM = "transform plug-in 'wrong-transform' (tests.wrong_returns:WrongTransform)"

    def test_every_transform_hook_has_a_contract_and_a_wrong_value_tried(self):
        assert set(contracts(transform=True)) == set(ClientTransform.HOOKS) == set(WRONG_TRANSFORM)
        assert {getattr(ClientTransform, h).__annotations__["return"] for h in ClientTransform.HOOKS} <= set(WHAT)

    @pytest.mark.parametrize("hook", ClientTransform.HOOKS)
    def test_in_process(self, tiny_fed, hook, monkeypatch):
        monkeypatch.setitem(TRANSFORMS, "wrong-transform", WrongTransform)
        with pytest.raises(HookError) as err:
            with tiny_sim(tiny_fed, "fedavg+wrong-transform", None, {"wrong-transform": {"hook": hook}},
                          rounds=2) as sim:
                sim.run()
        want = contracts(transform=True)[hook].what
        assert str(err.value).startswith(f"{self.TRANSFORM}: {hook} returned a {WRONG_TRANSFORM[hook][1]}, not "
                                         f"{want} (")
        assert (err.value.plugin, err.value.hook) == (self.TRANSFORM, hook)
