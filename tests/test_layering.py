"""The package's import structure matches the layers drawn in ``docs/architecture.md``.

Every ``import`` / ``from ... import`` of a ``fedblend`` module anywhere in a source file (also inside
functions) is an edge. A module may import only from its own layer or the layers below it, and the module graph
has no cycle. The layer order is read from the diagram in ``docs/architecture.md`` (so the drawing and the code
cannot drift apart).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"


def layers_from_docs() -> dict[str, int]:
    """``{package prefix: rank}`` from the fenced ``layers`` block of docs/architecture.md (top = highest)."""
    text = (REPO / "docs" / "architecture.md").read_text()
    block = re.search(r"```layers\n(.*?)```", text, re.S)
    assert block, "docs/architecture.md needs a ```layers block (one layer per line, highest first)"
    rows = [ln.split("#")[0].split() for ln in block.group(1).strip().splitlines()]
    rows = [r for r in rows if r]
    return {name: len(rows) - i for i, row in enumerate(rows) for name in row}


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in (SRC / "fedblend").rglob("*.py")}


def imports(path: Path, name: str, known: set[str]) -> set[str]:
    """fedblend modules imported by the module ``name`` (``from pkg import sub`` counts as ``pkg.sub``)."""
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("fedblend")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                pkg = pkg[: len(pkg) - node.level + 1]
                base = ".".join(pkg + ([node.module] if node.module else []))
            if not base.startswith("fedblend"):
                continue
            for a in node.names:
                sub = f"{base}.{a.name}"
                out.add(sub if sub in known else base)
    return out - {name}


def rank(module: str, layers: dict[str, int]) -> int | None:
    best = None
    for prefix, r in layers.items():
        full = f"fedblend.{prefix}"
        if module == full or module.startswith(full + "."):
            if best is None or len(prefix) > len(best[0]):
                best = (prefix, r)
    return None if best is None else best[1]


def graph() -> dict[str, set[str]]:
    mods = all_modules()
    return {m: imports(p, m, set(mods)) for m, p in mods.items()}


def test_every_module_has_a_layer():
    layers = layers_from_docs()
    missing = sorted(m for m in all_modules() if m != "fedblend" and rank(m, layers) is None)
    assert not missing, f"modules in no layer of docs/architecture.md: {missing}"


def test_imports_point_down_only():
    layers = layers_from_docs()
    bad = []
    for mod, deps in graph().items():
        r = rank(mod, layers)
        if r is None:
            continue
        for d in sorted(deps):
            rd = rank(d, layers)
            if rd is not None and rd > r:
                bad.append(f"{mod} (layer {r}) imports {d} (layer {rd})")
    assert not bad, "imports from a lower layer to a higher one:\n" + "\n".join(bad)


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for d in sorted(g.get(n, ())):
            if d not in g:
                continue
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in state and (c := visit(d)):
                return c
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(g):
        if n not in state and (c := visit(n)):
            return c
    return None


def test_no_import_cycle():
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_checker_catches_an_upward_import_and_a_cycle():
    """The checks themselves fail on a bad graph (so a green run means something)."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    layers = layers_from_docs()
    assert rank("fedblend.core.engine", layers) > rank("fedblend.data.federated", layers)
    assert rank("fedblend.cli.main", layers) > rank("fedblend.algorithms.fedavg", layers)


@pytest.mark.parametrize("low,high", [("common", "data"), ("data", "core"), ("models", "core"),
                                      ("core", "algorithms.parts"), ("algorithms.parts", "algorithms"),
                                      ("algorithms", "config"), ("config", "cli")])
def test_documented_order(low, high):
    layers = layers_from_docs()
    assert layers[low] < layers[high]


# ------------------------------------------------------------------------------------------ method modules
ALGORITHMS = "fedblend.algorithms"


def method_modules() -> dict[str, Path]:
    """The modules of ``algorithms/`` that define methods or transforms (not the parts, the registry, the package)."""
    return {m: p for m, p in all_modules().items()
            if m.startswith(ALGORITHMS + ".") and m.count(".") == 2 and not m.startswith(ALGORITHMS + ".parts")
            and m != ALGORITHMS + ".registry"}


def registers_transform(path: Path) -> bool:
    return "@register_transform" in path.read_text()


def bases_from(path: Path) -> dict[str, set[str]]:
    """``{module: names imported from it that a class of this file extends}`` (direct bases by name)."""
    tree = ast.parse(path.read_text())
    origin = {a.asname or a.name: node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
              for a in node.names if node.module}
    out: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for b in node.bases:
                if isinstance(b, ast.Name) and b.id in origin:
                    out.setdefault(origin[b.id], set()).add(b.id)
    return out


def method_import_violations(modules: dict[str, Path]) -> list[str]:
    """DESIGN principle 11: a method module imports parts, core and common, and of the other modules in
    ``algorithms/`` at most the one whose class it extends (and a transform it composes, as FedALA = FedAvg + ALA)."""
    known = set(all_modules())
    bad = []
    for mod, path in sorted(modules.items()):
        extends = bases_from(path)
        others = sorted(d for d in imports(path, mod, known) if d in modules)
        for d in others:
            if d in extends or registers_transform(modules[d]):
                continue
            bad.append(f"{mod} imports method module {d} without extending a class of it")
        if len([d for d in others if d in extends]) > 1:
            bad.append(f"{mod} extends classes of several method modules: {others}")
    return bad


def test_a_method_imports_parts_core_common_and_at_most_its_base():
    bad = method_import_violations(method_modules())
    assert not bad, "\n".join(bad)


def test_method_rule_catches_a_method_importing_a_helper_from_another(tmp_path):
    (tmp_path / "helper_user.py").write_text(
        "from fedblend.algorithms.fedprox import proximal_term\n"
        "from fedblend.algorithms.fedavg import FedAvg\n\nclass M(FedAvg):\n    pass\n")
    mods = {**method_modules(), "fedblend.algorithms.helper_user": tmp_path / "helper_user.py"}
    bad = method_import_violations(mods)
    assert bad == ["fedblend.algorithms.helper_user imports method module fedblend.algorithms.fedprox without "
                   "extending a class of it"]


PARTS = ALGORITHMS + ".parts"


def part_users(modules: dict[str, Path]) -> dict[str, set[str]]:
    """``{part: the methods (top-level modules or packages of algorithms/) that use it}``, directly or through
    another part; a method package's submodules count as the method."""
    known = set(modules)
    deps = {m: imports(p, m, known) for m, p in modules.items()}
    parts = {m for m in modules if m.startswith(PARTS + ".")}

    def reached(start: set[str]) -> set[str]:
        seen, todo = set(), [d for d in start if d in parts]
        while todo:
            d = todo.pop()
            if d not in seen:
                seen.add(d)
                todo += [e for e in deps[d] if e in parts]
        return seen

    users: dict[str, set[str]] = {p: set() for p in parts}
    for m in modules:
        if not m.startswith(ALGORITHMS + ".") or m.startswith(PARTS) or m == ALGORITHMS + ".registry":
            continue
        owner = ".".join(m.split(".")[:3])
        for d in reached(deps[m]):
            users[d].add(owner)
    return users


def test_every_part_has_two_or_more_users():
    """``algorithms/parts/`` holds what several methods share; one method's own code lives in its package."""
    lonely = {p: sorted(u) for p, u in part_users(all_modules()).items() if len(u) < 2}
    assert not lonely, f"parts with fewer than two users (move them into the method's package): {lonely}"


def test_part_users_rule_catches_a_part_with_one_user(tmp_path):
    (tmp_path / "solo.py").write_text("X = 1\n")
    (tmp_path / "m.py").write_text("from fedblend.algorithms.parts.solo import X\n")
    mods = {**all_modules(), PARTS + ".solo": tmp_path / "solo.py", ALGORITHMS + ".m": tmp_path / "m.py"}
    assert part_users(mods)[PARTS + ".solo"] == {ALGORITHMS + ".m"}
    assert part_users(mods)[PARTS + ".mix"] >= {ALGORITHMS + ".ala", ALGORITHMS + ".apfl"}  # ala via its package


# ------------------------------------------------------------------------------------------ size and core names
#: what a module of ``algorithms/`` (a method, a transform, a part) may grow to before it should be split
MAX_ALGORITHM_LINES = 250


def test_no_algorithms_module_is_over_the_line_limit():
    long = {str(p.relative_to(SRC)): n for p in (SRC / "fedblend" / "algorithms").rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_ALGORITHM_LINES}
    assert not long, f"modules of algorithms/ over {MAX_ALGORITHM_LINES} lines (split them into parts): {long}"


def code_words(source: str) -> set[str]:
    """The lower-case words of a module's code -- names, attributes, arguments, keywords, imports and string
    values, split at every character that is not a letter or digit -- without its docstrings and comments (which
    may cite a method as an example)."""
    tree = ast.parse(source)
    docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    words = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            words.append(node.id)
        elif isinstance(node, ast.Attribute):
            words.append(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            words.append(node.name)
        elif isinstance(node, ast.arg):
            words.append(node.arg)
        elif isinstance(node, ast.keyword) and node.arg:
            words.append(node.arg)
        elif isinstance(node, ast.alias):
            words += [node.name, node.asname or ""]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            words.append(node.value)
    return {w for text in words for w in re.split(r"[^a-z0-9]+", text.lower()) if w}


def method_words() -> set[str]:
    """Every registered method's and transform's name and class name, lower-case, as one word (``fedavg-ft`` ->
    ``fedavgft``), except FedAvg's and Local's: the core's ``Method`` *is* FedAvg, and "local" is a plain word."""
    from fedblend.algorithms import METHODS, TRANSFORMS

    classes = {**METHODS, **TRANSFORMS}
    words = {re.sub(r"[^a-z0-9]", "", n.lower()) for n in classes} | {c.__name__.lower() for c in classes.values()}
    return words - {"fedavg", "local"}


def core_method_names(files: dict[str, str]) -> dict[str, list[str]]:
    """``{file: method words its code uses}`` for the files (name -> source) that use any."""
    names = method_words()
    return {f: sorted(code_words(src) & names) for f, src in files.items() if code_words(src) & names}


def test_core_code_names_no_method():
    """The core is the interface and the runtimes: a field, function, option or string named after one method
    belongs in that method's module or in a part. (A name check cannot see a field that serves one method under
    a plain name, as DBE's former ``TrainSpec.feature_shift`` did; such needs go through data such as
    ``training.Forward``.)"""
    files = {str(p.relative_to(SRC)): p.read_text() for p in (SRC / "fedblend" / "core").rglob("*.py")}
    assert core_method_names(files) == {}


def test_core_name_check_catches_a_method_name_in_code_but_not_in_docs():
    src = ('"""Like DBE\'s bias."""\n'
           "def forward(x, dbe_shift=None):  # FedProto too\n"
           '    """APFL\'s mixture."""\n'
           '    return x.get("fedproto.protos")\n')
    assert core_method_names({"m.py": src}) == {"m.py": ["dbe", "fedproto"]}
    assert core_method_names({"m.py": '"""DBE, APFL, FedPHP as examples."""\nx = 1  # apple\n'}) == {}
