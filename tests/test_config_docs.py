"""``docs/config.md`` lists every config field with its default and allowed range exactly as the code checks
them (``fedblend.config.field_docs``, built from each options dataclass's types, ``CHOICES`` and ``RANGES``)."""

from __future__ import annotations

import re
from pathlib import Path

from fedblend.config import field_docs

DOC = Path(__file__).resolve().parents[1] / "docs" / "config.md"


def documented() -> dict[str, list[tuple[str, str, str]]]:
    """``{heading: [(field, default, allowed), ...]}`` from the doc's tables (first three columns)."""
    out: dict[str, list[tuple[str, str, str]]] = {}
    heading = None
    for line in DOC.read_text().splitlines():
        if line.startswith("#"):
            heading = re.sub(r"^#+\s*", "", line).replace(" (client optimiser)", "")
            continue
        m = re.match(r"\| `([^`]+)` \| (.*?) \| (.*?) \|", line)
        if m and heading is not None:
            out.setdefault(heading, []).append((m.group(1), m.group(2).strip(), m.group(3).strip()))
    return out


def test_every_field_documented_with_the_checked_range():
    docs, code = documented(), field_docs()
    assert set(code) <= set(docs), f"sections missing from docs/config.md: {sorted(set(code) - set(docs))}"
    for section, rows in code.items():
        assert docs[section] == [(f, d, a) for f, d, a in rows], (
            f"docs/config.md section {section!r} differs from the code; expected rows:\n"
            + "\n".join(f"| `{f}` | {d} | {a} |" for f, d, a in rows))


def test_the_comparison_fails_on_a_drifted_range(monkeypatch):
    from fedblend.core.training import TrainConfig

    monkeypatch.setattr(TrainConfig, "RANGES", {**TrainConfig.RANGES, "lr": ">= 0"})
    code = field_docs()
    assert ("lr", "`0.01`", "float >= 0") in code["`[train]`"]
    assert documented()["`[train]`"] != code["`[train]`"]


def test_eval_model_choices_documented_per_method():
    """docs/config.md's table of ``[eval] model`` choices is each registered method's ``eval_choices()`` (the
    default first), and ``METHOD+ala``'s row is what every host but Ditto offers with ALA."""
    from fedblend.algorithms import METHODS, build_method
    from tests.test_shared_suite import hosts

    rows = dict(re.findall(r"^\| `([^`]+)` \| ((?:`[a-z]+`(?: / )?)+) \|$", DOC.read_text(), re.M))
    want = {name: " / ".join(f"`{c}`" for c in build_method(name).eval_choices()) for name in METHODS}
    assert {k: v for k, v in rows.items() if k in METHODS} == want
    with_ala = {h: list(build_method(f"{h}+ala").eval_choices()) for h in hosts("ala")}
    assert {h: c for h, c in with_ala.items() if h != "ditto"} == {
        h: [c.strip("`") for c in rows["METHOD+ala"].split(" / ")] for h in with_ala if h != "ditto"}
    assert with_ala["ditto"] == ["trained"]
