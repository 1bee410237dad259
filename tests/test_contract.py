"""The client template is closed and every method goes through it (DESIGN principle 11, issue #22).

No registered method re-types ``Method.client_train``: variation goes through the hooks (``before_training``,
``client_init``, ``scored_params``, ``local_training``, ``reply``). So every cross-cutting client concern holds for
every method at once: each reports the before / after local training scores under ``eval.before_after`` on the
sequential and the vmap backend (which agree within float reassociation; the process backend's bit-equality is
``tests/test_shared_suite.py``'s), and each either honours a client transform (it runs in every training exchange)
or refuses it with an error naming why.
"""

import warnings

import pytest

from fedblend.algorithms import METHODS, TRANSFORMS, build_method
from fedblend.common.histories import diff_histories
from fedblend.core.engine import Simulation
from fedblend.core.evaluation import EvalProtocol
from fedblend.core.method import ClientTransform
from fedblend.core.sampling import SamplingConfig
from fedblend.core.training import TrainConfig
from fedblend.core.vmap import VmapBackend
from tests.helpers import without_timings
from tests.test_shared_suite import SPECS

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("name", sorted(METHODS))
def test_no_method_retypes_the_client_template(name):
    owners = [k.__name__ for k in METHODS[name].__mro__ if "client_train" in vars(k)]
    assert owners == ["Method"], f"{name}: client_train defined by {owners}; use the template's hooks"


def ba_sim(fed, spec: str, rounds: int = 2, backend=None) -> Simulation:
    return Simulation.create(build_method(spec), fed, "mlp", TrainConfig(lr=0.05, batch_size=16), rounds, 1,
                             SamplingConfig(join_ratio=0.75), EvalProtocol(before_after=True), backend=backend)


@pytest.mark.parametrize("spec", SPECS)
def test_every_method_reports_before_and_after_scores_on_sequential_and_vmap(spec, tiny_fed):
    """Both backends drive the same template, so both report bp/ap, and vmap's batched training agrees with the
    sequential one up to float reassociation (where it falls back to one by one, exactly)."""
    runs = []
    for backend in (None, VmapBackend()):
        sim = ba_sim(tiny_fed, spec, backend=backend)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the one-by-one notice
            sim.run()
        for m in sim.history:
            assert 0.0 <= m["bp_acc"] <= 1.0 and 0.0 <= m["ap_acc"] <= 1.0, (spec, m)
        runs.append([{k: v for k, v in m.items() if not k.startswith("vmap_")} for m in without_timings(sim.history)])
    assert diff_histories(runs[0], runs[1], rel=1e-4, abs_=1e-6) == []


class Probe(ClientTransform):
    """Counts, in the client state, the training exchanges it was applied in (and changes nothing)."""

    name = "probe"

    def apply(self, method, params, cstate, ctx):
        return params, {**cstate, "probe": cstate.get("probe", 0) + 1}


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_honours_a_transform_or_refuses_it(name, tiny_fed, monkeypatch):
    monkeypatch.setitem(TRANSFORMS, "probe", Probe)
    if not METHODS[name].accepts_transforms:
        with pytest.raises(ValueError, match=f"{name} trains from a model of its own"):
            build_method(f"{name}+probe")
        return
    sim = ba_sim(tiny_fed, f"{name}+probe", rounds=3)
    sim.run()
    trained = sum(len(m["selected"]) for m in sim.history)
    assert sum(s.get("probe", 0) for s in sim.store.states.values()) == trained

