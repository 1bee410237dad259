"""Built-in methods and transforms are found as plug-ins are: entry points of ``fedblend.methods`` /
``fedblend.transforms`` that fedblend's ``pyproject.toml`` declares (one package entry point per group,
``fedblend = "fedblend.algorithms"``), read from the installed package's metadata (in a source tree: from its
``pyproject.toml``); the package's methods are the classes its modules decorate with ``@register_method``
(``@register_transform``), each loaded through the plug-in checks (``fedblend.algorithms.registry.admit``)."""

from __future__ import annotations

import ast
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

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = REPO / "pyproject.toml"
ALGORITHMS = REPO / "src" / "fedblend" / "algorithms"
PACKAGE = {"fedblend": "fedblend.algorithms"}


def declared(kind: str) -> dict[str, str]:
    return registry.source_entry_points(plugins.GROUPS[kind], PYPROJECT)


def decorated_in_source(kind: str) -> set[str]:
    """``"module:Class"`` of every class decorated with ``@register_<kind>`` in the source files under
    ``src/fedblend/algorithms`` (read as text, nothing imported)."""
    found = set()
    for path in ALGORITHMS.rglob("*.py"):
        parts = path.relative_to(ALGORITHMS.parent.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(isinstance(d, ast.Name) and d.id == f"register_{kind}"
                                                      for d in node.decorator_list):
                found.add(f"{module}:{node.name}")
    return found


@pytest.mark.parametrize("kind", ["method", "transform"])
def test_pyproject_declares_the_algorithms_package_once(kind):
    """One package entry point per group, whatever the number of methods: a new built-in adds no line."""
    assert declared(kind) == PACKAGE


@pytest.mark.parametrize("kind,table", [("method", METHODS), ("transform", TRANSFORMS)])
def test_the_registry_is_exactly_what_the_package_defines(kind, table):
    """Every module under ``fedblend/algorithms`` that decorates a class with ``@register_method``
    (``@register_transform``) is found, every such class is registered under its own ``name``, and nothing else
    of fedblend is (a base class such as ``BodySharing``, not decorated, is not a method)."""
    builtins = {n: c for n, c in table.items() if c.__module__.startswith("fedblend.")}
    assert {f"{c.__module__}:{c.__qualname__}" for c in builtins.values()} == decorated_in_source(kind)
    assert set(registry.defined(kind, "fedblend.algorithms")) == set(builtins.values())
    assert all(c.name == n for n, c in builtins.items())
    assert len(builtins) >= (26 if kind == "method" else 1)


def _dist_with(tmp_path: Path, entry_points: str) -> metadata.Distribution:
    info = tmp_path / "fedblend-0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fedblend\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text(entry_points)
    return metadata.PathDistribution(info)


def test_an_installed_package_reads_its_metadata(tmp_path, monkeypatch):
    """Installed from a wheel (no source tree beside the package): the entry points of its metadata."""
    dist = _dist_with(tmp_path, "[fedblend.methods]\nfedblend = fedblend.algorithms\n"
                                "[fedblend.datasets]\nx = a:b\n")
    monkeypatch.setattr(registry.metadata, "distribution", lambda name: dist)
    monkeypatch.setattr(registry, "SOURCE_PYPROJECT", tmp_path / "pyproject.toml")
    assert registry.builtin_entry_points("method") == PACKAGE


@pytest.mark.parametrize("installed", ["none", "stale"])
def test_a_source_tree_reads_its_pyproject(installed, tmp_path, monkeypatch):
    """Not installed, or installed from an older pyproject.toml or another checkout: the source tree's own
    declarations, which match the code that runs."""
    def missing(name):
        raise metadata.PackageNotFoundError(name)

    stale = _dist_with(tmp_path, "[fedblend.methods]\nfedavg = fedblend.algorithms.moved:FedAvg\n")
    monkeypatch.setattr(registry.metadata, "distribution", missing if installed == "none" else lambda name: stale)
    assert registry.builtin_entry_points("method") == PACKAGE
    assert registry.builtin_entry_points("transform") == PACKAGE


@pytest.mark.parametrize("value,message", [
    ("fedblend.algorithmz", "fedblend's entry point fedblend = 'fedblend.algorithmz' of group 'fedblend.methods': "
                            "cannot import module 'fedblend.algorithmz': ModuleNotFoundError"),
    ("fedblend.algorithms.parts", "fedblend's entry point fedblend = 'fedblend.algorithms.parts' of group "
                                  "'fedblend.methods': 'fedblend.algorithms.parts' defines no method (a class "
                                  "decorated with @fedblend.algorithms.registry.register_method"),
    ("fedblend.algorithms.fedavg:Nope", "module 'fedblend.algorithms.fedavg' has no attribute 'Nope'"),
])
def test_a_bad_builtin_declaration_is_one_line_naming_it(value, message, monkeypatch):
    """A package entry point naming a missing module, or a package that defines no method (``parts`` has base
    classes of methods, none decorated), or a class entry point naming a missing class: the plug-in's one-line
    error."""
    monkeypatch.setattr(registry, "builtin_entry_points", lambda kind: {"fedblend": value} if kind == "method" else {})
    with pytest.raises(plugins.PluginError) as err:
        registry.load_builtins()
    assert message in str(err.value) and "\n" not in str(err.value)


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


def test_fedblend_methods_lists_every_builtin_once():
    """``fedblend methods`` (a fresh process: the registry as a user's first import fills it) lists the built-in
    methods in name order, then ``+ala``, none marked as a plug-in."""
    res = subprocess.run([sys.executable, "-m", "fedblend.cli.main", "methods"], capture_output=True, text=True,
                         check=True)
    names = [line.split()[0] for line in res.stdout.splitlines() if line and not line.startswith(" ")]
    assert names == sorted(n for n, c in METHODS.items() if c.__module__.startswith("fedblend.")) + ["+ala"]
    assert "[plug-in" not in res.stdout and res.stderr == ""
