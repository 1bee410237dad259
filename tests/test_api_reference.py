"""The API reference (``python bookkeeping/gen_docs.py api``, docs/api.md) builds, documents every public name of
its modules and has no broken cross-reference; a newcomer writing a server-side method (FedAvg with server
momentum) finds there what they need: the hooks' signatures, what a reply carries, where the helpers are."""

from __future__ import annotations

import re
import sys
import warnings

import pytest

from tests.helpers import load_script

gen = load_script("gen_docs", "bookkeeping")


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    pytest.importorskip("pdoc", reason="pdoc (the dev extra) builds the API reference")
    out = tmp_path_factory.mktemp("api")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        built = gen.build_api(out)
    pdoc_warnings = [str(w.message) for w in caught if "pdoc" in (w.filename or "")]
    assert pdoc_warnings == []
    return {p.relative_to(out).as_posix(): p.read_text() for p in built}


def test_every_listed_module_has_a_page(pages):
    want = {m.replace(".", "/") + ".html" for m in gen.API_MODULES}
    assert want <= set(pages), sorted(want - set(pages))


def test_every_public_name_has_a_docstring():
    assert gen.missing_docstrings() == []


def test_no_broken_cross_reference():
    assert gen.broken_references() == []


def test_a_server_side_method_is_written_from_the_reference(pages):
    """FedAvg with server momentum overrides ``init_server`` (its velocity) and ``aggregate_train`` (the momentum
    step on the replies' weighted mean): their signatures, the reply's record and ``num_samples``, the state's
    ``"global"`` entry and ``weighted_average``'s module are all on the reference's pages."""
    method, params, message = (pages["fedblend/core/method.html"], pages["fedblend/common/params.html"],
                               pages["fedblend/core/message.html"])
    context, traits = pages["fedblend/core/context.html"], pages["fedblend/core/traits.html"]
    for name in ("ServerHalf.init_server", "ServerHalf.aggregate_train", "ServerHalf.configure_train",
                 "ClientHalf.reply", "ServerHalf.global_params", "Method.declare"):
        assert f'id="{name}"' in method, name
    assert 'id="ServerCtx"' in context and 'id="ClientCtx"' in context and 'id="Traits"' in traits
    init_server = _section(method, "ServerHalf.init_server")
    assert "sctx" in init_server and "global" in init_server
    reply = _section(method, "ClientHalf.reply")
    assert "num_samples" in reply and "res.params" in reply
    assert 'id="weighted_average"' in params and 'id="Message.params"' in message
    assert "metrics" in _section(message, "Message")


def test_the_specs_the_testing_suite_and_the_api_are_documented(pages):
    assert 'id="TrainSpec"' in pages["fedblend/core/training.html"]
    assert 'id="EvalSpec"' in pages["fedblend/core/evaluation.html"]
    assert 'id="MethodContract"' in pages["fedblend/testing.html"]
    assert 'id="run"' in pages["fedblend/api.html"] and 'id="RunResult"' in pages["fedblend/api.html"]
    assert 'id="read_summary"' in pages["fedblend/results/runs.html"]


def test_roles_are_rendered_as_links(pages):
    """``:class:`~fedblend.core.message.Message``` in a docstring becomes a link to Message's entry, with no
    reStructuredText role left in the text."""
    method = pages["fedblend/core/method.html"]
    assert 'talk only in <code><a href="#Message">fedblend.core.message.Message</a></code>s.' in method
    docstrings = re.findall(r'<div class="docstring">(.*?)</div>', method, re.S)
    assert len(docstrings) > 20 and not [d for d in docstrings if re.search(r":(class|meth|func|mod):`", d)]


def _section(html: str, name: str) -> str:
    start = html.index(f'id="{name}"')
    nxt = re.compile(r'<div id="[A-Za-z_.]+" class="classattr">|<section id="')
    m = nxt.search(html, start + 10)
    return html[start:m.start() if m else len(html)]


def test_the_checks_see_a_missing_docstring_and_a_broken_reference(tmp_path, monkeypatch):
    (tmp_path / "apiref_probe.py").write_text(
        '"""Probe: :func:`helper` resolves, :class:`Nowhere` does not, :func:`fedblend.common.params.clone` does."""\n'
        "def helper():\n    '''See :meth:`Thing.go` and :meth:`Thing.gone`.'''\n\n"
        "def bare():\n    pass\n\n"
        "class Thing:\n    '''A thing.'''\n    def go(self):\n        pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert gen.missing_docstrings(("apiref_probe",)) == ["apiref_probe.bare", "apiref_probe.Thing.go"]
        assert gen.broken_references(("apiref_probe",)) == ["apiref_probe.helper: :meth:`Thing.gone`",
                                                             "apiref_probe: :class:`Nowhere`"]
    finally:
        sys.modules.pop("apiref_probe", None)


def docs_fedavgm(monkeypatch):
    """The FedAvgM block of docs/api.md, run as a module (in ``sys.modules`` while the test runs, as dataclasses
    need)."""
    import types
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "api.md").read_text()
    code = next(b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "class FedAvgM" in b)
    mod = types.ModuleType("docs_fedavgm")
    monkeypatch.setitem(sys.modules, "docs_fedavgm", mod)
    exec(compile(code, "docs/api.md", "exec"), mod.__dict__)
    return mod.FedAvgM


@pytest.mark.usefixtures("one_thread")
def test_the_documented_server_momentum_method_runs(monkeypatch):
    """docs/api.md's FedAvgM with ``beta = 0`` (and server_lr 1) moves the global model as FedAvg does (up to the
    rounding of ``g - (g - avg)``); with ``beta = 0.9`` it does not."""
    import torch

    from fedblend.testing import tiny_federation, tiny_sim

    fedavgm, fed = docs_fedavgm(monkeypatch), tiny_federation()
    plain = tiny_sim(fed, "fedavg")
    plain.run()
    for beta, same in ((0.0, True), (0.9, False)):
        sim = tiny_sim(fed, fedavgm, {"beta": beta})
        sim.run()
        close = all(torch.allclose(sim.server["global"][k], v, atol=1e-5) for k, v in plain.server["global"].items())
        assert close is same, beta
        assert set(sim.server) == {"global", "velocity"}
