"""Built-in methods and transforms are found as plug-ins are: entry points of ``fedblend.methods`` /
``fedblend.transforms`` that fedblend's ``pyproject.toml`` declares, read from the installed package's metadata
(in a source tree: from its ``pyproject.toml``), each loaded through the plug-in checks
(``fedblend.algorithms.registry.admit``)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from fedblend.algorithms import METHODS, TRANSFORMS, registry
from fedblend.common import plugins
from fedblend.core.method import Method

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def declared(kind: str) -> dict[str, str]:
    return registry.source_entry_points(plugins.GROUPS[kind], PYPROJECT)


@pytest.mark.parametrize("kind,table", [("method", METHODS), ("transform", TRANSFORMS)])
def test_the_registry_is_exactly_the_declared_entry_points(kind, table):
    """Every registered built-in is declared in pyproject.toml under its own ``name``, at its own class, and
    every declaration is registered (a module that registers a method nobody declared fails here too)."""
    want = declared(kind)
    assert want, f"pyproject.toml declares no {plugins.GROUPS[kind]}"
    builtins = {n: c for n, c in table.items() if c.__module__.startswith("fedblend.")}
    assert {n: f"{c.__module__}:{c.__qualname__}" for n, c in builtins.items()} == want
    assert all(c.name == n for n, c in builtins.items())


def _dist_with(tmp_path: Path, entry_points: str) -> metadata.Distribution:
    info = tmp_path / "fedblend-0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fedblend\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text(entry_points)
    return metadata.PathDistribution(info)


def test_an_installed_package_reads_its_metadata(tmp_path, monkeypatch):
    """Installed from a wheel (no source tree beside the package): the entry points of its metadata."""
    dist = _dist_with(tmp_path, "[fedblend.methods]\nfedavg = fedblend.algorithms.fedavg:FedAvg\n"
                                "[fedblend.datasets]\nx = a:b\n")
    monkeypatch.setattr(registry.metadata, "distribution", lambda name: dist)
    monkeypatch.setattr(registry, "SOURCE_PYPROJECT", tmp_path / "pyproject.toml")
    assert registry.builtin_entry_points("method") == {"fedavg": "fedblend.algorithms.fedavg:FedAvg"}


@pytest.mark.parametrize("installed", ["none", "stale"])
def test_a_source_tree_reads_its_pyproject(installed, tmp_path, monkeypatch):
    """Not installed, or installed from an older pyproject.toml or another checkout: the source tree's own
    declarations, which match the code that runs."""
    def missing(name):
        raise metadata.PackageNotFoundError(name)

    stale = _dist_with(tmp_path, "[fedblend.methods]\nfedavg = fedblend.algorithms.moved:FedAvg\n")
    monkeypatch.setattr(registry.metadata, "distribution", missing if installed == "none" else lambda name: stale)
    assert registry.builtin_entry_points("method") == declared("method")
    assert registry.builtin_entry_points("transform") == {"ala": "fedblend.algorithms.ala:ALA"}


def test_neither_metadata_nor_source_tree_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(registry.metadata, "distribution", lambda name: _dist_with(tmp_path, ""))
    monkeypatch.setattr(registry, "SOURCE_PYPROJECT", tmp_path / "pyproject.toml")
    with pytest.raises(ImportError, match=r"fedblend.methods.*pip install -e \."):
        registry.builtin_entry_points("method")
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "other"\n[project.entry-points."fedblend.methods"]\n'
                                             'x = "a:B"\n')
    assert registry.source_entry_points("fedblend.methods", tmp_path / "pyproject.toml") == {}


def test_installed_metadata_matches_pyproject():
    """Installed from this tree (``pip install -e .``, as CI does), the package's metadata declares what
    pyproject.toml declares: what a wheel built from it loads. Metadata of another checkout's install says
    nothing about this tree."""
    try:
        dist = metadata.distribution("fedblend")
    except metadata.PackageNotFoundError:
        pytest.skip("fedblend is not installed (the source-tree reading is tested above)")
    url = json.loads(dist.read_text("direct_url.json") or "{}").get("url", "")
    if url != PYPROJECT.parent.as_uri():
        pytest.skip(f"the installed fedblend is not this tree's ({url or 'no direct_url.json'})")
    for kind in ("method", "transform"):
        installed = {ep.name: ep.value for ep in dist.entry_points.select(group=plugins.GROUPS[kind])}
        assert installed == declared(kind), "fedblend's installed metadata is stale: run pip install -e ."


def test_a_declaration_goes_through_the_plugin_checks(monkeypatch):
    """A declared class that is not a Method, or has no options dataclass, or clashes with a registered name,
    fails as a plug-in would."""
    monkeypatch.setitem(METHODS, "fedavg", METHODS["fedavg"])
    with pytest.raises(plugins.PluginError, match="not a subclass of fedblend's Method"):
        registry.admit("method", "dbe", plugins.find("method", "fedblend.core.method:ClientTransform"))

    class NoOptions(Method):
        name = "no-options"
        options_cls = dict

    with pytest.raises(Exception, match="options_cls.*not a dataclass"):
        registry.admit("method", "no-options", NoOptions)

    @dataclasses.dataclass
    class Opts:
        pass

    class Other(Method):
        name = "fedavg"
        options_cls = Opts

    with pytest.raises(ValueError, match="'fedavg' registered twice"):
        registry.admit("method", "fedavg", Other)
    assert registry.admit("method", "fedavg", METHODS["fedavg"]) is METHODS["fedavg"]


def test_fedblend_methods_lists_every_declared_builtin_once():
    """``fedblend methods`` (a fresh process: the registry as a user's first import fills it) lists the declared
    methods in name order, then ``+ala``, none marked as a plug-in."""
    res = subprocess.run([sys.executable, "-m", "fedblend.cli.main", "methods"], capture_output=True, text=True,
                         check=True)
    names = [line.split()[0] for line in res.stdout.splitlines() if line and not line.startswith(" ")]
    assert names == sorted(declared("method")) + ["+ala"]
    assert "[plug-in" not in res.stdout and res.stderr == ""
