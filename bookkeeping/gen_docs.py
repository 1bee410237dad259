"""The documentation generated from the code and the method pages: docs/config.md's option tables,
docs/architecture.md's hook table, the README's methods table, and the API reference.

    python bookkeeping/gen_docs.py               # rewrite the generated blocks of docs/*.md and README.md
    python bookkeeping/gen_docs.py --check       # change nothing; exit 1 naming each stale block
    python bookkeeping/gen_docs.py api [--out build/api]   # the API reference (HTML, pdoc; docs/api.md)

A generated block sits between ``<!-- BEGIN GENERATED name ... -->`` and ``<!-- END GENERATED name -->``; the
text around it is written by hand. Sources:

* the option tables: every field of the run config's tables (``fedblend.config.field_docs``): its default, the
  allowed values the code checks (``CHOICES`` / ``RANGES``) and its meaning, the field's documentation
  (``fedblend.common.options.field_doc``: an option's ``help``, else the ``#:`` comment above the field);
* the ``[eval] model`` table: each registered method's ``eval_choices()``;
* the hook table: the members of :class:`fedblend.core.method.Method` whose docstring starts with "Hook" (its
  signature, the docstring's first sentence) and the classes among the registered methods' ancestors that
  override each;
* the README's methods table: one row per method page, from the page's line
  ``<!-- methods-table N: `name`, `+transform` | citation and one line -->`` (under its title), in the order of
  ``N``, linked to the page (:func:`method_rows`).

``tests/test_config_docs.py``, ``tests/test_contract.py`` and ``tests/test_readme.py`` compare the committed blocks with
what this writes;
``tests/test_api_reference.py`` builds the API reference and checks its docstrings and cross-references.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import re
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
COMMAND = "python bookkeeping/gen_docs.py"

#: the public surface the API reference documents: the method interface (its two halves, their hooks and the
#: specs they exchange), the parameter helpers a method uses, plug-ins, the contract suite, the Python API and the
#: results library
API_MODULES = ("fedblend.core.method", "fedblend.core.context", "fedblend.core.traits", "fedblend.core.template",
               "fedblend.core.message", "fedblend.core.training",
               "fedblend.core.evaluation", "fedblend.common.params", "fedblend.common.options", "fedblend.common.plugins",
               "fedblend.testing", "fedblend.api", "fedblend.results", "fedblend.results.runs", "fedblend.results.schema",
               "fedblend.results.stats", "fedblend.results.table", "fedblend.results.compare", "fedblend.results.names",
               "fedblend.results.figures", "fedblend.results.curves", "fedblend.results.heatmaps",
               "fedblend.results.partition", "fedblend.results.diagnostics", "fedblend.results.report")


# ------------------------------------------------------------------------------------------------ markdown text
ROLE = re.compile(r":(?:py:)?(?:class|meth|func|mod|attr|data|exc|obj):`(~?)([^`]+)`")


def markdown(text: str) -> str:
    """Docstring text (reStructuredText inline markup) as one line of markdown for a table cell: ````x```` ->
    ```x```, ``:class:`~a.b.C``` -> ```C```, ``docs/x.md`` -> a link relative to docs/, ``|`` escaped."""
    text = ROLE.sub(lambda m: f"`{m.group(2).split('.')[-1] if m.group(1) else m.group(2)}`", text)
    text = re.sub(r"``(.+?)``", r"`\1`", " ".join(text.split()))
    parts = re.split(r"(`[^`]*`)", text)  # link docs/ paths outside code spans only
    for i in range(0, len(parts), 2):
        parts[i] = re.sub(r"\bdocs/([\w./-]+\.md)(#[\w-]+)?", lambda m: f"[docs/{m.group(1)}{m.group(2) or ''}]"
                          f"({m.group(1)}{m.group(2) or ''})", parts[i])
    return "".join(parts).replace("|", "\\|")


def table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


# ---------------------------------------------------------------------------------------------- docs/config.md
def option_rows(rows: list[tuple[str, str, str, str]]) -> str:
    return table(("field", "default", "allowed", "meaning"), [(f"`{f}`", d, a, markdown(m)) for f, d, a, m in rows])


def config_blocks() -> dict[str, str]:
    """The generated blocks of docs/config.md, by name."""
    from fedblend.algorithms import METHODS, TRANSFORMS
    from fedblend.config import TABLES, field_docs

    docs = field_docs()
    out = {"top-level": option_rows(docs["Top level"])}
    for name in TABLES:
        out[name] = option_rows(docs[f"`[{name}]`"])
    out["eval-models"] = eval_model_table(METHODS, TRANSFORMS)
    sections = []
    for heading, rows in docs.items():
        m = re.fullmatch(r"`\[options\]` of `(.+)`|`\[(.+)\]` \(transform `\+.+`\)", heading)
        if not m:
            continue
        name = m.group(1) or m.group(2)
        text = [f"### {heading}", ""]
        page = DOCS / "methods" / f"{name}.md"
        if page.is_file():
            text += [f"What each option does: [docs/methods/{name}.md](methods/{name}.md).", ""]
        sections.append("\n".join(text) + "\n" + option_rows(rows))
    out["method-options"] = "\n\n".join(sections)
    assert set(out) - {"top-level", "eval-models", "method-options"} == set(TABLES)
    return out


def eval_model_table(methods: dict, transforms: dict) -> str:
    """Each registered method's ``[eval] model`` choices, the default first; ``METHOD+t`` for each transform:
    its choices with FedAvg as the host (which every host but those that keep their own evaluation shares)."""
    from fedblend.algorithms import build_method

    def cell(spec: str) -> str:
        return " / ".join(f"`{c}`" for c in build_method(spec).eval_choices())

    rows = [(f"`{n}`", cell(n)) for n in sorted(methods)]
    rows += [(f"`METHOD+{t}`", cell(f"fedavg+{t}")) for t in sorted(transforms)]
    return table(("method", "`model` choices, the default first"), rows)


# ----------------------------------------------------------------------------------------- docs/architecture.md
def hooks(method_cls: type | None = None) -> list[str]:
    """The hooks a method author overrides: the ``HOOKS`` each class of ``method_cls``'s hierarchy declares (the
    server half's, then the client half's, then ``Method``'s declarations, then a subclass's own), in that order."""
    from fedblend.core.method import ClientHalf, Method, ServerHalf

    method_cls = method_cls or Method
    halves = [ServerHalf, ClientHalf]
    out: list[str] = []
    for k in halves + [k for k in reversed(method_cls.__mro__) if k not in halves]:
        out += [h for h in vars(k).get("HOOKS", ()) if h not in out]
    return out


def hook_owners(methods, names: list[str], base: type) -> dict[str, list[type]]:
    """``{hook: classes that define it}`` over the methods' class hierarchies (``base`` and the classes it is made
    of, the two halves, left out)."""
    core = set(base.__mro__)
    classes = {k for c in methods for k in c.__mro__ if issubclass(k, base) and k not in core}
    return {h: sorted((k for k in classes if h in vars(k)), key=lambda k: k.__name__.lower()) for h in names}


def signature(func: Callable) -> str:
    sig = inspect.signature(func)
    args = ", ".join(p for p in sig.parameters if p != "self")
    ret = sig.return_annotation
    text = f"`{func.__name__}({args})" + ("" if ret is inspect.Signature.empty else f" -> {ret}") + "`"
    return text.replace("|", "\\|")


def first_sentence(doc: str) -> str:
    text = " ".join(doc.split("\n\n")[0].split())
    text = re.sub(r"^Hook\b[,:]?\s*", "", text)
    m = re.match(r"(.+?\.)(\s+[A-Z(]|$)", text)
    text = m.group(1) if m else text
    return text[:1].upper() + text[1:]


def hook_table() -> str:
    from fedblend.algorithms import METHODS
    from fedblend.core.method import Method

    names = hooks(Method)
    builtins = [m for m in METHODS.values() if m.__module__.startswith("fedblend.")]  # not a test's plug-in
    owners = hook_owners(builtins, names, Method)
    registered = set(builtins)

    def who(k: type) -> str:
        return vars(k).get("display_name", k.__name__) if k in registered else f"`{k.__name__}`"

    rows = [(signature(getattr(Method, h)), markdown(first_sentence(inspect.getdoc(getattr(Method, h)))),
             ", ".join(who(k) for k in owners[h]) or "none") for h in names]
    return table(("hook", "what it does (`Method`'s default)", "overridden by"), rows)


# -------------------------------------------------------------------------------------------------- README.md
ROW = re.compile(r"^<!-- methods-table (\d+): (.+?) \| (.+) -->$", re.M)


def method_rows() -> list[tuple[int, list[str], str, str]]:
    """``(N, names, text, page stem)`` of every method page's README row, in the table's order (``N``, then the
    page's name): ``names`` the backquoted names of the first cell (``fedavg``, ``+ala``). A page with a
    ``methods-table`` line that does not parse is an error naming it."""
    rows = []
    for page in sorted((DOCS / "methods").glob("*.md")):
        text = page.read_text()
        found = ROW.findall(text)
        if len(found) != text.count("<!-- methods-table"):
            raise SystemExit(f"docs/methods/{page.name}: a methods-table line is not "
                             f"'<!-- methods-table N: `name`, ... | citation and one line -->'")
        rows += [(int(n), re.findall(r"`([^`]+)`", names), f"{names} | {line}", page.stem) for n, names, line in found]
    return sorted(rows, key=lambda r: (r[0], r[3]))


def methods_table() -> str:
    """The README's methods table: name(s), paper and one line, the page (:func:`method_rows`)."""
    rows = [f"| {cells} | [{stem}](docs/methods/{stem}.md) |" for _, _, cells, stem in method_rows()]
    return "\n".join(["| method | paper | docs |", "|---|---|---|", *rows])


# ------------------------------------------------------------------------------------------------ the blocks
#: each generated file (relative to the repository root) and what writes its blocks
FILES: dict[str, Callable[[], dict[str, str]]] = {"docs/config.md": config_blocks,
                                                  "docs/architecture.md": lambda: {"hooks": hook_table()},
                                                  "README.md": lambda: {"methods": methods_table()}}
BEGIN = "<!-- BEGIN GENERATED {name}: {command}; edit the code, not this block -->"
END = "<!-- END GENERATED {name} -->"


def block_re(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- BEGIN GENERATED {re.escape(name)}:[^\n]*-->\n)(.*?)(\n<!-- END GENERATED "
                      rf"{re.escape(name)} -->)", re.S)


def render(text: str, blocks: dict[str, str], where: str) -> str:
    """``text`` with each block's content replaced; a block without its markers is an error naming them."""
    for name, content in blocks.items():
        pattern = block_re(name)
        if len(pattern.findall(text)) != 1:
            raise SystemExit(f"{where}: needs exactly one generated block {name!r}, between the lines\n"
                             f"{BEGIN.format(name=name, command=COMMAND)}\n{END.format(name=name)}")
        text = pattern.sub(lambda m, c=content: m.group(1) + c + m.group(3), text)
    return text


def stale() -> Iterator[tuple[Path, str, str]]:
    """``(path, committed text, generated text)`` for every file whose generated blocks differ from the code."""
    for fname, make in FILES.items():
        path = ROOT / fname
        old = path.read_text()
        new = render(old, make(), fname)
        if new != old:
            yield path, old, new


# ------------------------------------------------------------------------------------------ the API reference
def _plain_roles(convert: Callable) -> Callable:
    """pdoc's docstring conversion with reStructuredText roles (``:class:`~a.b.C```) as code spans that pdoc
    links (```a.b.C```; pdoc links identifiers in code spans)."""
    def wrapped(docstring: str, docformat: str, source_file):
        return convert(ROLE.sub(lambda m: f"`{m.group(2)}`", docstring), docformat, source_file)
    return wrapped


def build_api(out: Path, modules: tuple[str, ...] = API_MODULES) -> list[Path]:
    """Write the API reference of ``modules`` as HTML under ``out`` (pdoc); returns the pages written."""
    import pdoc
    import pdoc.docstrings
    import pdoc.render

    pdoc.render.configure(docformat="restructuredtext", show_source=True, search=True,
                          footer_text="fedblend API reference (python bookkeeping/gen_docs.py api)")
    original = pdoc.docstrings.convert
    pdoc.docstrings.convert = _plain_roles(original)
    try:
        with warnings.catch_warnings():  # fedblend.results exports report, which adds .report a second time
            warnings.filterwarnings("ignore", "The module specification 'fedblend.results.report' adds")
            pdoc.pdoc(*modules, output_directory=out)
    finally:
        pdoc.docstrings.convert = original
    return sorted(out.rglob("*.html"))


def public_objects(modules: tuple[str, ...] = API_MODULES) -> Iterator[tuple[str, object, str]]:
    """``(name, object, defining module)`` of every public class, function, method and property of ``modules``
    (a module's ``__all__`` where it has one, else the names not starting with ``_`` that it defines; a class's
    members that it defines itself), each once, named where it is defined (``fedblend.config.RunConfig``, which
    ``fedblend.api`` exports)."""
    seen: set[str] = set()
    for modname in modules:
        mod = importlib.import_module(modname)
        names = getattr(mod, "__all__", None) or [n for n, v in vars(mod).items() if not n.startswith("_")
                                                  and getattr(v, "__module__", None) == modname]
        for name in names:
            obj = getattr(mod, name)
            if not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            home = obj.__module__
            qual = f"{home}.{obj.__qualname__}"
            if qual in seen:
                continue
            seen.add(qual)
            yield qual, obj, home
            if inspect.isclass(obj):
                for mname, member in vars(obj).items():
                    if mname.startswith("_") or not (inspect.isfunction(member) or isinstance(
                            member, (property, classmethod, staticmethod))):
                        continue
                    yield f"{qual}.{mname}", getattr(obj, mname, member), home


def _docstring(obj: object) -> str:
    """``obj``'s docstring (a method's may be inherited); a class's own only, not the ``Name(field, ...)`` line
    ``dataclass`` writes for a class without one."""
    if inspect.isclass(obj):
        doc = inspect.cleandoc(vars(obj).get("__doc__") or "")
        return "" if doc.startswith(f"{obj.__name__}(") else doc
    return inspect.getdoc(obj.fget if isinstance(obj, property) else obj) or ""


def missing_docstrings(modules: tuple[str, ...] = API_MODULES) -> list[str]:
    """The public names of ``modules`` without a docstring (an override inherits its base's)."""
    return [qual for qual, obj, _ in public_objects(modules) if not _docstring(obj).strip()]


def resolve(target: str, module: str, owner: str | None = None) -> bool:
    """Whether a cross-reference ``target`` (``a.b.C``, ``C.meth``, ``meth``) names something from ``module``
    (and class ``owner`` there): as a full dotted path, or relative to the module's or the class's names."""
    target = target.removesuffix("()")
    mod = importlib.import_module(module)
    starts: list[object] = [mod]
    if owner is not None:
        starts.insert(0, getattr(mod, owner, None))
    for start in starts:
        if start is not None and _walk(start, target.split(".")):
            return True
    parts = target.split(".")
    for i in range(len(parts), 0, -1):
        try:
            root = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        return _walk(root, parts[i:])
    return False


def _walk(obj: object, parts: list[str]) -> bool:
    for p in parts:
        if inspect.ismodule(obj) and not hasattr(obj, p):
            try:
                obj = importlib.import_module(f"{obj.__name__}.{p}")
                continue
            except ImportError:
                return False
        if not hasattr(obj, p) and p not in getattr(obj, "__annotations__", {}):
            return False
        obj = getattr(obj, p, None)
    return True


def broken_references(modules: tuple[str, ...] = API_MODULES) -> list[str]:
    """``"name: :role:`target`"`` for each cross-reference in the docstrings of ``modules`` (the modules' own
    and their public names') that names nothing."""
    out = []
    docs = [(m, inspect.getdoc(importlib.import_module(m)) or "", m, None) for m in modules]
    for qual, obj, home in public_objects(modules):
        docs.append((qual, _docstring(obj), home, qual[len(home) + 1:].split(".")[0]))
    for qual, doc, home, owner in docs:
        for m in ROLE.finditer(doc):
            if not resolve(m.group(2), home, owner):
                out.append(f"{qual}: {m.group(0)}")
    return sorted(set(out))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], prog=COMMAND)
    ap.add_argument("what", nargs="?", choices=("tables", "api"), default="tables",
                    help="tables: the generated blocks of docs/*.md (default); api: the API reference")
    ap.add_argument("--check", action="store_true", help="tables: write nothing, exit 1 if a block is stale")
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "api", help="api: output folder (build/api)")
    args = ap.parse_args(argv)
    if args.what == "api":
        problems = [f"no docstring: {n}" for n in missing_docstrings()] + \
                   [f"broken reference: {r}" for r in broken_references()]
        pages = build_api(args.out)
        print(f"{len(pages)} pages in {args.out} (open {args.out / 'index.html'})")
        for p in problems:
            print(f"gen_docs: warning: {p}", file=sys.stderr)
        return 1 if problems else 0
    changed = list(stale())
    for path, _, new in changed:
        if args.check:
            print(f"{path.relative_to(ROOT)} is stale: run {COMMAND}", file=sys.stderr)
        else:
            path.write_text(new)
            print(f"wrote {path.relative_to(ROOT)}")
    return 1 if changed and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
