"""Every ``fedblend`` command the README and ``docs/`` show is one the command line accepts: its subcommand
and flags parse, and the configs it names (under ``configs/``, ``results/``, ``examples/``) exist and (but a
plug-in package's, under ``examples/``) load with its ``--set`` / ``--grid`` values (the config's own
validation: fields, ranges, method and options). Nothing runs.

A command is taken from a shell block (```` ```bash ````, indented ones too, continuation lines joined, ``#`` comments, ``&&`` /
``|`` / ``;`` chains split) or from an inline code span, after leading ``VAR=value`` assignments; braces expand
as the shell would (``t1-fmnist-{pat,dir}-fedavg.toml``). A span that only names a command (``fedblend run``)
is checked for its subcommand and flags, and so is one with placeholders (``CONFIG``, ``DIR``, ``N``, ``...``,
``[--flag]``, ``<method>``, ``a|b``), since its words are not a command line. The run folders ``report`` and
``export`` name under ``results/`` must exist.

The docs' Python blocks are checked the same way: the names they import from fedblend exist, and so do the
``fedblend.X`` and ``result.X`` they use; a config given to ``fedblend.run`` as a dict loads."""

from __future__ import annotations

import itertools
import re
import shlex
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
CHECKED_ROOTS = ("configs/", "results/", "examples/")
PLACEHOLDER = re.compile(r"(?<![\w.])[A-Z][A-Z0-9_]*(?![\w])|\.\.\.|[\[\]<>]|\w\|\w")
CONFIG_COMMANDS = {"run", "pretrain", "partition", "bench", "deploy"}
# runtime flags whose value prose may show (`fedblend run --threads 1`); --set is not one: a span that sets the
# config is a command line, and its config is loaded
VALUED = {"--threads", "--backend", "--workers", "--device", "--rounds", "--nodes", "--jobs"}


def expand_braces(text: str) -> list[str]:
    """Shell brace expansion of non-nested ``{a,b}`` groups: ``x-{a,b}-{c,d}`` gives four words."""
    parts = re.split(r"(\{[^{}]*,[^{}]*\})", text)
    choices = [p[1:-1].split(",") if p.startswith("{") and p.endswith("}") else [p] for p in parts]
    return ["".join(c) for c in itertools.product(*choices)]


def _commands_in(line: str) -> list[str]:
    out = []
    for part in re.split(r"\s(?:&&|\|\||\||;)\s|;\s", line):
        words = part.strip().split()
        while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):
            words = words[1:]
        if words and words[0] == "fedblend":
            out.append(" ".join(words))
    return out


def documented_commands() -> list[tuple[str, str, bool]]:
    """``(where, command, inline)`` for every fedblend command in the docs (``where``: file and line; ``inline``:
    from a code span in prose rather than a shell block)."""
    found = []
    for doc in DOCS:
        text = doc.read_text()
        rel = doc.relative_to(REPO)
        for m in re.finditer(r"^[ \t]*```(\w*)\n(.*?)^[ \t]*```", text, re.S | re.M):  # list items indent them
            if m.group(1) not in ("", "bash", "sh", "console", "shell"):
                continue
            first = text.count("\n", 0, m.start(2)) + 1
            joined, start = "", None
            for n, line in enumerate(m.group(2).split("\n")):
                start = first + n if start is None else start
                joined += re.sub(r"(^|\s)#.*$", "", line)
                if joined.endswith("\\"):  # a continuation line
                    joined = joined[:-1] + " "
                    continue
                found += [(f"{rel}:{start}", c, False) for c in _commands_in(joined)]
                joined, start = "", None
        prose = re.sub(r"^[ \t]*```.*?^[ \t]*```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S | re.M)
        for m in re.finditer(r"`([^`]+)`", prose):
            line = text.count("\n", 0, m.start()) + 1
            found += [(f"{rel}:{line}", c, True) for c in _commands_in(m.group(1).replace("\n", " "))]
    return found


def _config_loads(path: str, overrides: list[str]) -> None:
    from fedblend.config import load_config

    load_config(REPO / path if path else None, overrides)


def check(command: str, mention: bool = False) -> None:
    """Raise (with the reason) when ``command`` is not one fedblend accepts (see the module docstring).
    ``mention``: an inline span, which may name a subcommand and flags without a whole command line."""
    from fedblend.cli.main import parser

    words = shlex.split(command)[1:]
    subparsers = parser()._subparsers._group_actions[0].choices  # noqa: SLF001 - argparse has no public API
    if words and not words[0].startswith("-"):
        assert words[0] in subparsers, f"no subcommand {words[0]!r} (have {sorted(subparsers)})"
        options = subparsers[words[0]]._option_string_actions  # noqa: SLF001
        for flag in (w.split("=", 1)[0] for w in words[1:] if w.startswith("--")):
            assert flag in options, f"fedblend {words[0]} has no option {flag}"
    if PLACEHOLDER.search(" ".join(words[1:])):
        return  # a synopsis with placeholders: its subcommand and flags are checked
    if mention and all(w.startswith("-") or words[i - 1] in VALUED for i, w in enumerate(words) if i):
        return  # prose naming a subcommand and its flags (`fedblend report --compare`): checked above
    from fedblend.cli.main import config_overrides
    from fedblend.cli.sweep import parse_grid

    for argv in itertools.product(*(expand_braces(w) for w in words)):
        args = parser().parse_args(list(argv))
        if args.cmd not in CONFIG_COMMANDS | {"sweep"}:
            for path in getattr(args, "runs", None) or [getattr(args, "run_dir", None)]:
                if path and path.startswith(CHECKED_ROOTS):
                    assert (REPO / path).exists(), f"{path} does not exist"
            continue
        overrides = config_overrides(args) if args.cmd != "sweep" else list(args.overrides)
        configs = args.configs if args.cmd == "sweep" else [args.config]
        cells = parse_grid(args.grid) if args.cmd == "sweep" else [[]]  # every grid value (the product: the same)
        for config in configs:
            if config and not config.startswith(CHECKED_ROOTS):
                continue  # the user's own file, or a run's output
            assert not config or (REPO / config).is_file(), f"{config} does not exist"
            if config and config.startswith("examples/"):
                continue  # a plug-in package's config: loads where the package is installed (tests/test_plugins.py)
            for cell in cells:
                _config_loads(config, overrides + cell)  # no config: the flags alone make it


COMMANDS = documented_commands()


def test_the_docs_show_commands_from_every_part_of_the_command_line():
    subcommands = {shlex.split(c)[1] for _, c, _ in COMMANDS if len(shlex.split(c)) > 1}
    assert {"run", "sweep", "report", "partition", "pretrain", "deploy", "bench", "export", "methods",
            "configs"} <= subcommands
    assert len(COMMANDS) > 100


@pytest.mark.parametrize("where,command,inline", COMMANDS, ids=[f"{w} {c[:60]}" for w, c, _ in COMMANDS])
def test_documented_command_parses_and_its_configs_load(where, command, inline):
    try:
        check(command, mention=inline)
    except SystemExit as exc:  # argparse's own exit (--version, --help)
        assert exc.code == 0, f"{where}: {command}: exit {exc.code}"
    except Exception as exc:  # noqa: BLE001 - the reason is the message
        pytest.fail(f"{where}: {command}\n  {type(exc).__name__}: {exc}")


@pytest.mark.parametrize("bad", [
    "fedblend runn configs/quickstart.toml",  # no such subcommand
    "fedblend run configs/quickstart.toml --thread 1",  # no such flag
    "fedblend run configs/missing.toml --out runs/x",  # no such config
    "fedblend run configs/quickstart.toml --set rounds=0",  # out of range
    "fedblend run configs/quickstart.toml --set method=fedphp --set options.bogus=1",  # not an option
    "fedblend sweep configs/quickstart.toml --grid method=fedavg,nosuch --out x",  # a grid value
    "fedblend run configs/{quickstart,missing}.toml",  # one of the expanded words
    "fedblend run --set method=nosuch --set rounds=1",  # no config: the flags alone
    "fedblend run configs/quickstart.toml --backend vmap --workers 0",  # a runtime flag's range
    "fedblend report results/t1/no-such-row --compare a b",  # a committed run folder that is not there
])
def test_check_refuses_a_command_fedblend_would_refuse(bad):
    with pytest.raises(Exception):  # noqa: B017 - whichever error the command line or the config raises
        check(bad)
    with pytest.raises(Exception):  # noqa: B017 - the same from prose
        check(bad, mention=True)


def test_prose_may_name_a_subcommand_and_its_flags_but_not_a_flag_it_lacks():
    check("fedblend report --compare", mention=True)
    check("fedblend run --threads 1", mention=True)
    with pytest.raises(Exception, match="expected 2 arguments"):  # a shell block's command must be whole
        check("fedblend report --compare")
    with pytest.raises(AssertionError, match="no option --comparex"):
        check("fedblend report --comparex", mention=True)
    with pytest.raises(AssertionError, match="no subcommand"):
        check("fedblend reprot", mention=True)


def test_commands_are_read_from_shell_blocks_and_inline_spans(tmp_path, monkeypatch):
    doc = tmp_path / "x.md"
    doc.write_text("Run `FEDBLEND_DATA=d fedblend run configs/a.toml --set seed=1` or:\n\n```bash\n"
                   "pip install -e . && fedblend report runs/ \\\n  --out r  # a comment\n```\n\n"
                   "```python\nfedblend.run('x')\n```\n`fedblend methods | head` and `fedblend export a|b RUN_DIR`\n")
    monkeypatch.setattr(sys.modules[__name__], "DOCS", [doc])
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    assert [(c, inline) for _, c, inline in documented_commands()] == [
        ("fedblend report runs/ --out r", False), ("fedblend run configs/a.toml --set seed=1", True),
        ("fedblend methods", True), ("fedblend export a|b RUN_DIR", True)]
    assert expand_braces("t-{a,b}-{c,d}.toml") == ["t-a-c.toml", "t-a-d.toml", "t-b-c.toml", "t-b-d.toml"]


def python_blocks() -> list[tuple[str, str]]:
    """``(where, code)`` of every ```` ```python ```` block in the docs that is Python (some sketch an algorithm
    in pseudo-code: those do not compile and are left out)."""
    blocks = []
    for doc in DOCS:
        text = doc.read_text()
        for m in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M):
            try:
                compile(m.group(1), str(doc), "exec")
            except SyntaxError:
                continue
            blocks.append((f"{doc.relative_to(REPO)}:{text.count(chr(10), 0, m.start()) + 1}", m.group(1)))
    return blocks


BLOCKS = python_blocks()


@pytest.mark.parametrize("where,code", BLOCKS, ids=[w for w, _ in BLOCKS])
def test_documented_python_names_what_fedblend_has(where, code):
    """Its ``from fedblend... import`` names exist, so do the ``fedblend.X`` it calls and the ``result.X`` of the
    ``RunResult`` that ``fedblend.run`` returns; a config ``fedblend.run`` is given as a dict loads."""
    import ast
    import dataclasses
    import importlib

    import fedblend
    from fedblend.api import RunResult, load

    tree = ast.parse(code)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "fedblend":
            module = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(module, alias.name), f"{where}: {node.module} has no {alias.name}"
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            names = {"fedblend": set(dir(fedblend)),
                     "result": set(dir(RunResult)) | {f.name for f in dataclasses.fields(RunResult)}}
            assert node.value.id not in names or node.attr in names[node.value.id], \
                f"{where}: {node.value.id}.{node.attr} does not exist"
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "run"
              and isinstance(node.func.value, ast.Name) and node.func.value.id == "fedblend" and node.args
              and isinstance(node.args[0], ast.Dict)):
            load(ast.literal_eval(node.args[0]))


def test_the_docs_python_blocks_are_found_and_checked():
    assert {w.split(":")[0] for w, _ in BLOCKS} >= {"README.md", "docs/workflow.md", "docs/deploy.md",
                                                     "docs/plugins.md"}
