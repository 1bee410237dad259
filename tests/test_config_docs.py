"""``docs/config.md``'s tables are generated from the code (``python bookkeeping/gen_docs.py``): every config
field with its default, the allowed range the code checks (``fedblend.config.field_docs``, from each options
dataclass's types, ``CHOICES`` and ``RANGES``) and its documentation; the committed page must equal what the
generator writes, so a stale page fails with the command that fixes it."""

from __future__ import annotations

import difflib

import pytest

from fedblend.config import field_docs
from tests.helpers import load_script

gen = load_script("gen_docs", "bookkeeping")


def stale_diff(fname: str) -> str:
    for path, old, new in gen.stale():
        if path.name == fname:
            diff = difflib.unified_diff(old.splitlines(), new.splitlines(), "committed", "generated", lineterm="", n=0)
            return "\n".join(list(diff)[:40])
    return ""


def test_config_doc_is_the_generated_text():
    diff = stale_diff("config.md")
    assert not diff, f"docs/config.md is stale: run python bookkeeping/gen_docs.py\n{diff}"


def test_every_field_has_a_meaning():
    """A field without a ``help`` / ``#:`` documentation would leave its meaning cell empty."""
    empty = [(section, f) for section, rows in field_docs().items() for f, _, _, meaning in rows if not meaning.strip()]
    assert empty == []


def test_a_drifted_range_makes_the_page_stale(monkeypatch):
    from fedblend.core.training import TrainConfig

    monkeypatch.setattr(TrainConfig, "RANGES", {**TrainConfig.RANGES, "lr": ">= 0"})
    assert ("lr", "`0.01`", "float >= 0", "SGD learning rate") in field_docs()["`[train]`"]
    assert "| `lr` | `0.01` | float >= 0 | SGD learning rate |" in stale_diff("config.md")


def test_a_changed_field_doc_makes_the_page_stale(monkeypatch):
    from fedblend.common import options

    real = options.field_doc
    monkeypatch.setattr(options, "field_doc", lambda cls, name: "changed" if name == "momentum" else real(cls, name))
    assert "| `momentum` | `0.0` | float [0, 1) | changed |" in stale_diff("config.md")


def test_field_doc_reads_help_then_the_comment_above():
    import dataclasses

    from fedblend.common.options import field_doc, opt

    @dataclasses.dataclass
    class Opts:
        a: int = opt(1, "from help")
        #: from the comment,
        #: two lines
        b: int = 2
        c: int = 3  # a trailing comment is no documentation

    assert [field_doc(Opts, n) for n in "abc"] == ["from help", "from the comment, two lines", ""]


def test_markdown_of_docstring_text():
    assert gen.markdown("``x`` and :class:`~fedblend.core.message.Message`, :meth:`Method.reply`") == \
        "`x` and `Message`, `Method.reply`"
    assert gen.markdown("see docs/workflow.md#resume, not `docs/x.md`; a | b") == \
        "see [docs/workflow.md#resume](workflow.md#resume), not `docs/x.md`; a \\| b"


def test_a_page_without_its_markers_is_refused():
    with pytest.raises(SystemExit, match="BEGIN GENERATED train"):
        gen.render("no markers here", {"train": "rows"}, "docs/config.md")
    text = "a\n<!-- BEGIN GENERATED train: x -->\nold\n<!-- END GENERATED train -->\nb"
    assert gen.render(text, {"train": "new"}, "x") == text.replace("old", "new")


def test_eval_model_row_of_ala_holds_for_every_host_but_ditto():
    """The generated ``METHOD+ala`` row is FedAvg's with ALA; every host but Ditto (which evaluates its own
    ``v_k``) offers exactly those choices with ALA."""
    from fedblend.algorithms import build_method
    from tests.test_shared_suite import hosts

    fedavg = list(build_method("fedavg+ala").eval_choices())
    with_ala = {h: list(build_method(f"{h}+ala").eval_choices()) for h in hosts("ala")}
    assert {h: c for h, c in with_ala.items() if h != "ditto"} == {h: fedavg for h in with_ala if h != "ditto"}
    assert with_ala["ditto"] == ["trained"]
