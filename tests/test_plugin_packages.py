"""A package declares all its methods with one entry point: ``toys = "fedblend_toys"`` in group
``fedblend.methods`` names a package, and every class its modules (subpackages included) decorate with
``@register_method`` is a method under its class's ``name`` -- as fedblend declares its own built-ins. A real
package is written to disk and installed (``pip install --target``); every command runs in a fresh process
with it on ``PYTHONPATH``, so this module's registry is left alone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import pip_install_target

PYPROJECT = """[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "fedblend-toys"
version = "1.0"

[project.entry-points."fedblend.methods"]
toys = "fedblend_toys"
ghosts = "fedblend_ghosts_missing"

[tool.setuptools.packages.find]
where = ["src"]
"""

HEAVY = '''"""A method in the package's top-level module."""
from dataclasses import dataclass

from fedblend.algorithms.fedavg import FedAvg
from fedblend.algorithms.registry import register_method


@dataclass(frozen=True)
class Options:
    pass


@register_method
class ToyHeavy(FedAvg):
    name, options_cls, paper = "toy-heavy", Options, "a toy"
'''

PROX = '''"""A method in a subpackage, a base class that is not decorated, and a built-in imported (not defined here)."""
from fedblend.algorithms.fedavg import FedAvg  # noqa: F401 - decorated, but defined in fedblend
from fedblend.algorithms.fedprox import FedProx
from fedblend.algorithms.registry import register_method


class ToyBase(FedProx):
    name = "toy-base"


@register_method
class ToyProx(ToyBase):
    name = "toy-prox"
'''


@pytest.fixture(scope="module")
def toys(tmp_path_factory) -> dict[str, str]:
    """The package installed into a temporary folder; the environment of a process that has it."""
    tmp = tmp_path_factory.mktemp("toys")
    pkg = tmp / "src" / "src" / "fedblend_toys"
    (pkg / "more").mkdir(parents=True)
    (tmp / "src" / "pyproject.toml").write_text(PYPROJECT)
    (pkg / "__init__.py").write_text('"""Toy methods."""\n')
    (pkg / "heavy.py").write_text(HEAVY)
    (pkg / "more" / "__init__.py").write_text("")
    (pkg / "more" / "prox.py").write_text(PROX)
    error = pip_install_target(tmp / "src", tmp / "site")
    if error is not None:
        pytest.skip(f"cannot install the toy package with pip: {error}")
    path = [str(tmp / "site"), str(Path(__file__).resolve().parents[1] / "src"), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}


def fedblend(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fedblend.cli.main", *args], capture_output=True, text=True, env=env,
                          timeout=300)


def test_methods_lists_every_decorated_class_of_the_package_and_warns_about_the_broken_one(toys):
    res = fedblend(toys, "methods")
    assert res.returncode == 0, res.stderr
    lines = {line.split()[0]: line for line in res.stdout.splitlines() if line.strip()}
    assert lines["toy-heavy"].endswith("[plug-in: fedblend_toys.heavy]")
    assert lines["toy-prox"].endswith("[plug-in: fedblend_toys.more.prox]")
    assert "toy-base" not in lines  # not decorated: a base class, not a method
    assert not any("[plug-in" in line for name, line in lines.items() if not name.startswith("toy-"))
    assert "fedblend: warning: method package ghosts cannot be used: method plug-in entry point ghosts = " \
           "'fedblend_ghosts_missing' of group 'fedblend.methods' (package fedblend-toys 1.0): cannot import module " \
           "'fedblend_ghosts_missing': ModuleNotFoundError" in res.stderr


RUN = ["--set", "dataset=synthetic", "--set", "model=mlp", "--set", "rounds=1", "--set", "partition.num_clients=3",
       "--set", "partition.min_samples=5", "--set", "log.plot=false", "--quiet", "--threads", "1"]


def test_run_finds_a_package_method_by_its_name_with_a_transform(toys, tmp_path):
    res = fedblend(toys, "run", "--set", "method=toy-prox+ala", "--set", "options.mu=0.1", *RUN,
                   "--out", str(tmp_path / "run"))
    assert res.returncode == 0, res.stderr
    assert 'method = "toy-prox+ala"' in (tmp_path / "run" / "config.toml").read_text()
    assert (tmp_path / "run" / "summary.json").is_file()


def test_an_unknown_name_reports_the_package_that_cannot_be_loaded(toys, tmp_path):
    res = fedblend(toys, "run", "--set", "method=toy-nothing", *RUN, "--out", str(tmp_path / "run"))
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "entry point ghosts = 'fedblend_ghosts_missing'" in res.stderr and "cannot import module" in res.stderr
    assert not (tmp_path / "run").exists()
