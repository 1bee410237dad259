"""The README is the product's front page: short, free of measurements that belong in the docs, its test command
the one CI runs, and its own-method snippet a plug-in that works (it is FedProx, so it equals the built-in one)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fedblend.cli.main import main

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()


def _bash_lines(text: str) -> list[str]:
    return [line.strip() for m in re.finditer(r"^```bash\n(.*?)^```", text, re.S | re.M)
            for line in m.group(1).splitlines()]


def test_readme_is_about_120_lines():
    assert len(README.splitlines()) <= 130


def test_readme_names_no_commit_date_or_machine():
    """Commit hashes, dates, CPU / GPU kinds and timings belong in docs/benchmarks.md and docs/workflow.md."""
    assert not re.findall(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b", README)
    assert not re.findall(r"\b20\d\d-\d\d-\d\d\b", README)
    assert not re.findall(r"Xeon|EPYC|AVX|H100|H200|per round\b|\d+(\.\d+)? ?(s|seconds|minutes)\b", README)


def test_ci_runs_the_readmes_test_command_verbatim():
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    command = ci[ci.index("# --- the README's test command, verbatim ---") + 1].strip()
    assert command.endswith("python -m pytest -q")
    assert command in _bash_lines(README)


@pytest.fixture
def snippet_module(tmp_path, monkeypatch):
    """The README's own-method snippet as the module ``myprox`` on ``sys.path``; the registry and the module
    cache are restored afterwards (a plug-in named by path registers itself)."""
    import sys

    from fedblend.algorithms import METHODS

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "myprox.py").write_text(_own_method_snippet())
    monkeypatch.syspath_prepend(str(tmp_path / "pkg"))
    saved = dict(METHODS)
    yield
    METHODS.clear()
    METHODS.update(saved)
    sys.modules.pop("myprox", None)


def _own_method_snippet() -> str:
    block = next(m.group(1) for m in re.finditer(r"^```python\n(.*?)^```", README, re.S | re.M)
                 if "class MyProx" in m.group(1))
    assert len([line for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]) <= 13
    return block


ARGS = ["--set", "dataset=synthetic", "--set", "model=mlp", "--set", "rounds=2", "--set", "partition.num_clients=3",
        "--set", "partition.min_samples=5", "--set", "log.plot=false", "--quiet", "--threads", "1"]
MU = ["--set", "options.mu=0.1"]


def _history(out: Path) -> list[tuple]:
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [(r["acc"], r["train_loss"]) for r in rows]


def test_readme_own_method_runs_as_a_plugin_and_equals_the_builtin_fedprox(tmp_path, snippet_module):
    command = re.search(r"#\s+(fedblend run .*)", README).group(1).split()  # the snippet's own command line
    assert command[:3] == ["fedblend", "run", "configs/quickstart.toml"] and "method=myprox:MyProx" in command
    assert main(["run", "--set", "method=myprox:MyProx", *MU, *ARGS, "--out", str(tmp_path / "mine")]) == 0
    assert main(["run", "--set", "method=fedprox", *MU, *ARGS, "--out", str(tmp_path / "builtin")]) == 0
    mine, builtin = _history(tmp_path / "mine"), _history(tmp_path / "builtin")
    assert mine == builtin
    assert main(["run", "--set", "method=fedavg", *ARGS, "--out", str(tmp_path / "fedavg")]) == 0
    assert _history(tmp_path / "fedavg") != mine  # the proximal term changes training


def test_readme_own_method_command_line_loads_with_the_snippet_importable(snippet_module):
    from tests.test_docs_commands import check

    check(re.search(r"#\s+(fedblend run .*)", README).group(1))
    with pytest.raises(Exception):  # noqa: B017 - the config's own error: the snippet has no option 'nu'
        check("fedblend run configs/quickstart.toml --set method=myprox:MyProx --set options.nu=1")


# ----------------------------------------------------------------------------------- the generated methods table
def _gen():
    from tests.helpers import load_script

    return load_script("gen_docs", "bookkeeping")


def test_readme_methods_table_is_generated_from_the_method_pages():
    """The table between the README's ``methods`` markers is what ``python bookkeeping/gen_docs.py`` writes from
    the ``<!-- methods-table N: ... -->`` line of each page under docs/methods."""
    import difflib

    stale = [(old, new) for path, old, new in _gen().stale() if path.name == "README.md"]
    diff = "\n".join(difflib.unified_diff(*(t.splitlines() for t in stale[0]), "committed", "generated",
                                          lineterm="", n=0)) if stale else ""
    assert not stale, f"README.md's methods table is stale: run python bookkeeping/gen_docs.py\n{diff}"


def test_a_method_page_line_is_its_readme_row(tmp_path, monkeypatch):
    """Editing a page's line changes its row (and only the generator writes the README); a line that does not
    parse is an error naming its page."""
    import shutil

    gen = _gen()
    shutil.copytree(gen.DOCS / "methods", tmp_path / "methods")
    page = tmp_path / "methods" / "fedapa.md"
    page.write_text(page.read_text().replace("IJCAI 2025 (", "IJCAI 2025, edited ("))
    monkeypatch.setattr(gen, "DOCS", tmp_path)
    table = gen.methods_table()
    assert "| `fedapa` | Sun et al., FedAPA, IJCAI 2025, edited (" in table and table not in README
    page.write_text(page.read_text().replace("<!-- methods-table 3: `fedapa` |", "<!-- methods-table x: `fedapa`"))
    with pytest.raises(SystemExit, match="docs/methods/fedapa.md: a methods-table line is not"):
        gen.method_rows()


def test_every_builtin_method_and_transform_has_a_row_and_every_row_is_registered():
    from fedblend.algorithms import METHODS, TRANSFORMS

    names = {n for _, cell, _, _ in _gen().method_rows() for n in cell}
    builtins = {n for n, c in METHODS.items() if c.__module__.startswith("fedblend.")} | \
               {f"+{n}" for n, c in TRANSFORMS.items() if c.__module__.startswith("fedblend.")}
    assert not builtins - names, (f"registered without a row in the README's methods table: {sorted(builtins - names)}; "
                                  "add a '<!-- methods-table N: `name` | paper, one line -->' line under the title "
                                  "of its docs/methods page, then run python bookkeeping/gen_docs.py")
    assert not names - builtins, f"rows of methods that are not registered: {sorted(names - builtins)}"
