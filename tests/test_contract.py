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
from tests.helpers import load_script, without_timings
from tests.test_shared_suite import SPECS, SUITE_OPTIONS

pytestmark = pytest.mark.usefixtures("one_thread")
GEN = load_script("gen_docs", "bookkeeping")


@pytest.mark.parametrize("name", sorted(METHODS))
def test_no_method_retypes_the_client_template(name):
    """The client template is a function of the core (``template.client_train``), not a member: no method class
    defines it or another former hook that is machinery now (a class that tries is refused when written)."""
    from fedblend.core.method import NOT_HOOKS, Method

    owners = {f"{k.__name__}.{n}" for k in METHODS[name].__mro__ if k is not Method for n in NOT_HOOKS if n in vars(k)}
    assert not owners, f"{name}: {sorted(owners)} defined; use the template's hooks"


def test_a_class_that_retypes_the_template_is_refused_where_it_is_written():
    from fedblend.algorithms.fedavg import FedAvg

    for name in ("client_train", "train_spec", "shared_names", "apply_transforms"):
        with pytest.raises(TypeError, match=f"overrides {name}, which is no longer a hook"):
            type("Retyped", (FedAvg,), {name: lambda self, *a: None})


def ba_sim(fed, spec: str, rounds: int = 2, backend=None) -> Simulation:
    return Simulation.create(build_method(spec, SUITE_OPTIONS.get(spec)), fed, "mlp",
                             TrainConfig(lr=0.05, batch_size=16), rounds, 1, SamplingConfig(join_ratio=0.75),
                             EvalProtocol(before_after=True), backend=backend)


@pytest.mark.parametrize("spec", SPECS)
def test_every_method_reports_before_and_after_scores_on_sequential_and_vmap(spec, tiny_fed):
    """Both backends drive the same template, so both report bp/ap, and vmap's batched training agrees with the
    sequential one up to float reassociation (where it falls back to one by one, exactly); every round's vmap
    counts cover its clients, so the second run really went through vmap."""
    runs = []
    for backend in (None, VmapBackend()):
        sim = ba_sim(tiny_fed, spec, backend=backend)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the one-by-one notice
            sim.run()
        for m in sim.history:
            assert 0.0 <= m["bp_acc"] <= 1.0 and 0.0 <= m["ap_acc"] <= 1.0, (spec, m)
            if backend is not None:  # vmap ran every client's training: batched, or one by one with a reason
                counted = sum(v for k, v in m.items() if k.startswith("vmap_"))
                assert counted >= len(m["selected"]), (spec, "training not accounted for by vmap", m)
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
    if not build_method(name).traits.accepts_transforms:
        with pytest.raises(ValueError, match=f"{name} trains from a model of its own"):
            build_method(f"{name}+probe")
        return
    sim = ba_sim(tiny_fed, f"{name}+probe", rounds=3)
    sim.run()
    trained = sum(len(m["selected"]) for m in sim.history)
    assert sum(s.get("probe", 0) for s in sim.store.states.values()) == trained



def test_architecture_hook_table_is_the_generated_text():
    """docs/architecture.md's table of the hooks is what ``python bookkeeping/gen_docs.py`` writes from the two
    halves' ``HOOKS`` and ``Method``'s, and the built-in methods' overrides."""
    stale = [p.name for p, _, _ in GEN.stale() if p.name == "architecture.md"]
    assert stale == [], "docs/architecture.md's hook table is stale: run python bookkeeping/gen_docs.py"


def test_hook_table_follows_the_class_and_its_overrides():
    """The generator reads the hooks from the classes' ``HOOKS`` (server half, client half, declarations, then a
    subclass's own) and names exactly the classes that override each one."""
    from fedblend.core.method import ClientHalf, Method, ServerHalf

    assert GEN.hooks(Method) == [*ServerHalf.HOOKS, *ClientHalf.HOOKS, *Method.HOOKS]

    class Grown(Method):
        HOOKS = ("extra_hook", "init_server")

        def extra_hook(self, msg):
            """Something new (default: nothing)."""

    assert GEN.hooks(Grown) == [*GEN.hooks(Method), "extra_hook"]
    owners = GEN.hook_owners([METHODS["fedamp"], METHODS["apple"], METHODS["fedavg"]], GEN.hooks(Method), Method)
    assert [k.__name__ for k in owners["client_init"]] == ["APPLE", "FedAMP"] and owners["before_training"] == []
    assert not [k for ks in owners.values() for k in ks if k.__module__ == "fedblend.core.method"]  # nor the halves
    row = next(r for r in GEN.hook_table().splitlines() if r.startswith("| `scored_params("))
    assert row.endswith("| DBE |") and "Params \\| EvalSpec" in row
