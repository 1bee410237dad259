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
from tests.test_shared_suite import SPECS, SUITE_OPTIONS

pytestmark = pytest.mark.usefixtures("one_thread")


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



HOOKS = ("before_training", "client_init", "scored_params", "local_training", "reply")


def hook_owners(methods) -> dict[str, set[str]]:
    """``{hook: lower-case names of the classes that define it}`` over the methods' class hierarchies (``Method``
    and its two halves, which define every hook, left out)."""
    from fedblend.core.method import ClientHalf, Method, ServerHalf

    core = (Method, ServerHalf, ClientHalf)
    return {h: {k.__name__.lower() for c in methods for k in c.__mro__ if h in vars(k) and k not in core}
            for h in HOOKS}


def documented_hook_owners(text: str) -> dict[str, set[str]]:
    """The "overridden by" column of the hook table in docs/architecture.md: ``{hook: lower-case class names}``
    (notes in parentheses and backticks dropped)."""
    import re

    out = {}
    for line in text.splitlines():
        m = re.match(r"\| `(\w+)\(.*\| (.*) \|$", line)
        if m and m.group(1) in HOOKS:
            names = re.sub(r"\([^)]*\)", "", m.group(2)).replace("`", "")
            out[m.group(1)] = {n.strip().lower() for n in names.split(",") if n.strip()}
    return out


def test_architecture_hook_table_lists_every_override():
    """docs/architecture.md's table of the template's hooks names exactly the classes that override each one."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "architecture.md").read_text()
    assert documented_hook_owners(text) == hook_owners(METHODS.values())


def test_hook_table_check_sees_a_missing_and_an_extra_name():
    table = ("| `client_init(msg, cstate, ctx) -> params` | received over own | FedAMP (Eq. 5), `APPLE` |\n"
             "| `reply(res, msg, cstate, ctx) -> Message` | shared | Local (nothing) |\n")
    assert documented_hook_owners(table) == {"client_init": {"fedamp", "apple"}, "reply": {"local"}}
    owners = hook_owners([METHODS["fedamp"], METHODS["apple"], METHODS["fedavg"]])
    assert owners["client_init"] == {"fedamp", "apple"} and owners["before_training"] == set()


def test_no_built_in_method_or_part_declares_a_trait_as_a_class_attribute():
    """Traits come from ``declare`` alone: no class under ``fedblend.algorithms`` (methods and the bases they
    share) sets a former declaration class attribute or a :class:`Traits` field name."""
    import dataclasses

    from fedblend.core.method import LEGACY_DECLARATIONS, Method, Traits

    names = set(LEGACY_DECLARATIONS) | {f.name for f in dataclasses.fields(Traits)}
    classes = {k for c in METHODS.values() for k in c.__mro__ if issubclass(k, Method) and k is not Method}
    assert {"FedAvg", "BodySharing", "OwnLoopMethod", "PrototypeUpload"} <= {k.__name__ for k in classes}
    found = {f"{k.__name__}.{n}" for k in classes for n in names if n in vars(k)}
    assert not found, f"declare these in declare(): {sorted(found)}"
    assert not any(k._legacy for k in classes)


def author_members() -> tuple[set[str], set[str]]:
    """``(hooks, everything else public)`` of a built ``Method``: its declared hooks (``Method.HOOKS`` and the
    halves'), and the public names of the class, its halves and a built instance that are not hooks."""
    from fedblend.core.method import ClientHalf, Method, ServerHalf

    hooks = set(Method.HOOKS) | set(ServerHalf.HOOKS) | set(ClientHalf.HOOKS)
    names = {n for k in Method.__mro__ if k is not object for n in vars(k) if not n.startswith("_")}
    names |= {n for n in vars(Method()) if not n.startswith("_")}
    return hooks, names - hooks


def test_a_method_author_knows_at_most_twenty_hooks_and_the_rest_is_listed_machinery():
    """#49: a method is two small declared halves. The hooks a method author overrides number at most 20, and
    every other public member of ``Method`` is its identity, the hook lists, or machinery the runtimes read
    (``Method.MACHINERY``): nothing else hides on the class."""
    from fedblend.core.method import Method

    hooks, rest = author_members()
    assert len(hooks) <= 20, sorted(hooks)
    assert all(callable(getattr(Method, h)) for h in hooks)
    identity = {"name", "options_cls", "paper", "HOOKS", "MACHINERY"}
    assert rest == identity | set(Method.MACHINERY), sorted(rest - identity - set(Method.MACHINERY))


def test_the_hooks_are_listed_in_the_class_docstring_and_in_docs_architecture():
    from pathlib import Path

    from fedblend.core.method import Method

    hooks, _ = author_members()
    doc = Method.__doc__
    text = (Path(__file__).resolve().parents[1] / "docs" / "architecture.md").read_text()
    table = [line for line in text.splitlines() if line.startswith("| members |") or line.startswith("| `")]
    assert {h for h in hooks if f"``{h}``" not in doc and f":meth:`{h}`" not in doc} == set()
    assert {h for h in hooks if not any(f"`{h}" in line for line in table)} == set()
    assert f"{len(hooks)} hooks" in text
