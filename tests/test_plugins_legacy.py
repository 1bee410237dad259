"""A plug-in written before ``Method.declare`` (its traits as class attributes) still builds, with a FutureWarning
naming ``declare``, and gets the traits the equivalent declaration gives."""

from __future__ import annotations

import dataclasses

import pytest

from fedblend.algorithms.fedavg import FedAvg
from fedblend.core.method import LEGACY_DECLARATIONS, Method, Traits


def legacy_class(**attrs):
    with pytest.warns(FutureWarning, match="declare"):
        return type("OldStyle", (Method,), {"name": "old-style-test", **attrs})


def test_old_class_attributes_map_onto_the_traits_with_a_warning():
    old = legacy_class(eval_model="its own model", shares="body", has_global=False, trains_from_received=True,
                       client_keeps_model=False, client_own_loop=True, evaluates_own_model=True,
                       param_records=["params", "extra"], extra_entries=("scale",))

    class New(Method):
        def declare(self, choice):
            return Traits(shares="body", global_model=False, trains_from_received=True, keeps_model=False,
                          own_loop=True, evaluates_own_model=True, param_records=("params", "extra"),
                          extra_entries=("scale",))

        def eval_models(self):
            return {"trained": "its own model"}

    assert old().traits == New().traits
    assert old().eval_choices() == {"trained": "its own model"}


def test_old_evaluates_received_model_names_the_choice_received():
    old = legacy_class(evaluates_received_model=True, eval_model="what it receives")
    assert old().eval_choices() == {"received": "what it receives"}
    assert old().traits.evaluates_received_model and old().traits.eval_model == "what it receives"


def test_old_declarations_are_inherited_and_overridden_like_attributes():
    base = legacy_class(has_global=False)
    with pytest.warns(FutureWarning):
        child = type("Child", (base,), {"client_keeps_model": False})
    assert not child().traits.global_model and not child().traits.keeps_model
    assert base().traits.keeps_model  # the child's declaration does not leak into its base


def test_old_pretrainable_is_read_from_the_class():
    assert legacy_class(pretrainable=True).pretrainable
    assert not FedAvg.pretrainable


def test_a_declaration_class_attribute_gives_no_warning_on_a_new_style_class(recwarn):
    class Fine(FedAvg):
        name = "fine-test"

        def declare(self, choice):
            return dataclasses.replace(super().declare(choice), keeps_model=True)

    assert Fine().traits.keeps_model
    assert not [w for w in recwarn if issubclass(w.category, FutureWarning)]


def test_every_former_declaration_is_mapped():
    fields = {f.name for f in dataclasses.fields(Traits)}
    assert all(v in fields for v in LEGACY_DECLARATIONS.values() if v)
    for old in LEGACY_DECLARATIONS:
        if old in ("eval_model", "pretrainable"):
            continue
        value = {"shares": "body", "param_records": ("params",), "extra_entries": ("x",)}.get(old, False)
        cls = legacy_class(**{old: value})
        assert getattr(cls().traits, LEGACY_DECLARATIONS[old]) == value, old


def test_old_attributes_on_a_subclass_of_a_built_in_override_its_declaration():
    """``class Mine(FedAvg): client_keeps_model = True`` kept the model before ``declare``; it still does, and
    its ``eval_model`` still describes what it evaluates."""
    with pytest.warns(FutureWarning):
        mine = type("Mine", (FedAvg,), {"name": "mine-test", "client_keeps_model": True,
                                        "eval_model": "the received model, my way"})
    assert not FedAvg().traits.keeps_model and mine().traits.keeps_model
    assert mine().traits.evaluates_received_model  # FedAvg's declaration, which the class did not change
    assert mine().eval_choices() == {"received": "the received model, my way"}


def test_a_transform_declares_its_needs_and_old_class_attributes_still_work():
    """ALA declares what it needs of its host in ``declare()``; a plug-in transform that still sets the former
    class attributes gets the same needs, with a FutureWarning (the never-used ``requires_global`` asked for a
    model to blend, a received one now)."""
    from fedblend.algorithms.ala import ALA
    from fedblend.core.method import ClientTransform
    from fedblend.core.traits import TransformTraits

    assert ALA().traits == TransformTraits(needs_local_model=True, requires_received=True, own_loop=True,
                                           per_client_stats=("ala_epochs", "ala_loss", "ala_w_"))
    with pytest.warns(FutureWarning, match="declare"):
        old = type("OldTransform", (ClientTransform,), {"name": "old-t", "needs_local_model": True,
                                                        "requires_global": True, "per_client_stats": ["x_"]})
    assert old().traits == TransformTraits(needs_local_model=True, requires_received=True, per_client_stats=("x_",))
    assert ClientTransform().traits == TransformTraits()


def test_no_built_in_transform_declares_its_needs_as_class_attributes():
    from fedblend.algorithms import TRANSFORMS
    from fedblend.core.traits import TRANSFORM_LEGACY

    found = {f"{k.__name__}.{n}" for c in TRANSFORMS.values() for k in c.__mro__ for n in TRANSFORM_LEGACY
             if n in vars(k)}
    assert not found and not any(c._legacy for c in TRANSFORMS.values())
