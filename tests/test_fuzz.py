"""Property-based fuzz (hypothesis) of the command line and the config: every generated input either runs (exit 0)
or ends in exactly one ``fedblend: error: ...`` line on stderr with exit 2 -- never a traceback, never another
exit code, never a second error line.

Inputs are whole command lines of every command (``run``, ``partition``, ``sweep``, ``deploy --write-app``,
``bench``, ``pretrain``, ``report``, ``export``, ``methods``, ``configs``, garbage), each with valid-ish and hostile
``--set`` overrides and flag values: wrong types, negative, huge (``1e11``, ``2**63``), ``nan`` / ``inf``, empty
strings, unknown and malformed keys, path-like names (``../x``, ``a/b``), unicode, TOML fragments. Each is run
in-process through ``fedblend.cli.main.main(argv)`` with stdout encoded strictly as UTF-8 and stderr with
backslash escapes (as a UTF-8 terminal does), from a scratch working directory. The data are the synthetic
dataset's (``FEDBLEND_DATA`` points at an empty folder): a missing or corrupt archive is a fault of the machine,
exit 1, tested in ``tests/test_bad_inputs.py``, as is ``--resume`` without a checkpoint (never generated here).

``test_cli_fuzz`` uses the validation paths (``run --check``, ``sweep --dry-run``, ``partition`` without training,
``deploy --write-app``) so nothing trains; ``test_run_fuzz`` trains for real (one round of the synthetic data,
every registered method, hostile values within a small range or outside the allowed one).

Budget: ``FEDBLEND_FUZZ_EXAMPLES`` examples for ``test_cli_fuzz`` (default 40, derandomized so the default suite is
reproducible; set it for a long random search, e.g. ``FEDBLEND_FUZZ_EXAMPLES=10000 python -m pytest
tests/test_fuzz.py -k cli_fuzz``), and a tenth of it for ``test_run_fuzz`` (at least 6).
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis", reason="the fuzz needs hypothesis (pip install -e '.[dev]')")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from fedblend.algorithms import METHODS, TRANSFORMS  # noqa: E402
from fedblend.cli.main import main  # noqa: E402
from fedblend.config import SCALARS, TABLES  # noqa: E402

EXAMPLES = int(os.environ.get("FEDBLEND_FUZZ_EXAMPLES", "40"))
LONG = "FEDBLEND_FUZZ_EXAMPLES" in os.environ
SETTINGS = dict(deadline=None, database=None, derandomize=not LONG, print_blob=True,
                suppress_health_check=list(HealthCheck))

BASE = ["--set", "dataset=synthetic", "--set", "model=mlp", "--set", "rounds=1", "--set", "partition.num_clients=3",
        "--set", "partition.min_samples=5", "--set", "checkpoint_every=1", "--set", "log.plot=false"]

# ------------------------------------------------------------------------------------------------ values
NUMBERS = ["0", "1", "2", "3", "-1", "-0.0", "0.5", "1.5", "0.01", "1e-320", "1e308", "1e11", "100000000000",
           "9223372036854775807", "9223372036854775808", "-9223372036854775809", "4294967296", "1000001",
           "nan", "inf", "-inf", "+inf", "1_000", "0x10", "1e", "--1", "1,2"]
STRINGS = ['""', '"x"', "''", '"../x"', '"a/b"', '"/tmp/x"', '".."', '"."', '"é"', '"\\u0000"', '"\\n"',
           '"\\u202e"', '"a\\\\b"', '"fedavg"', '"' + "n" * 300 + '"', "x", "é", "..", "../../x", "a/b", "", " ",
           "\t", "ünïcödé", "🙂", "-", "--", "=", "[", "{", "]", '"', "'", "#", "true", "false", "True",
           # files of the scratch folder, for the fields that name one (partition.path, options.agent)
           '"tiny.toml"', '"run"', '"file"', '"empty"', '"run/partition.json"', '"run/metrics.jsonl"',
           '"run/checkpoint.pt"', '"notpart.json"', '"outside.json"', '"pfl"', '"pfl/train"']
TOML = ["[1, 2]", "[]", "[0]", "[1, 0]", "[-1]", "{}", "{a = 1}", "[[1]]", '["x"]', "[nan]", "1979-05-27"]
CHOICES = ["fedavg", "fedprox", '"fedavg+ala"', '"fedprox+ala"', '"local+ala"', '"fedavg+nosuch"', '"+ala"', '"fedavg+"',
           "synthetic", "imagenet", "mlp", "lenet5", "cnn4", "fasttext", "iid", "dirichlet", "pathological",
           "shards", "one_class", "domains", "indices", "flwr", "merge", "official", "train_val_test", "test", "val",
           "best", "final", "keep", "reset", "fixed", "uniform_range", "cpu", "cuda", "auto", "sequential",
           "processes", "vmap", "stop", "skip", "memory", "disk", "fedapa", "pflib", *sorted(METHODS)]
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)
HOSTILE = st.one_of(st.sampled_from(NUMBERS + STRINGS + TOML), st.integers(-10**13, 10**13).map(str),
                    st.floats(allow_nan=True, allow_infinity=True).map(repr), TEXT)
PLAUSIBLE = st.sampled_from(["0", "1", "2", "3", "5", "10", "0.1", "0.5", "0.9", "1.0", "true", "false", '"x"',
                             "[1, 2]", *CHOICES])


def mostly(valid, hostile) -> st.SearchStrategy:
    """Seven draws in eight from ``valid``, one from ``hostile``: about half the command lines get past every
    check, so the deeper ones (ranges, cross-field rules, data, partition, model, method state) are reached."""
    return st.integers(0, 7).flatmap(lambda k: hostile if k == 7 else valid)


def _option_keys() -> list[str]:
    import dataclasses

    keys = set()
    for cls in METHODS.values():
        keys |= {f"options.{f.name}" for f in dataclasses.fields(cls.options_cls)}
    for name, cls in TRANSFORMS.items():
        keys |= {f"{name}.{f.name}" for f in dataclasses.fields(cls.options_cls)}
    return sorted(keys)


KNOWN_KEYS = sorted(SCALARS) + [f"{t}.{f}" for t, cls in TABLES.items() for f in cls.__dataclass_fields__
                                if not f.isupper()] + _option_keys()
WEIRD_KEYS = ["", ".", "..", "a..b", "train.", ".lr", "train.lr.x", "colour", "ala", "options", "partition",
              "options.nosuch", "ala.nosuch", "é", "train lr", "train.lr ", " rounds", "ROUNDS", "__class__",
              "log.tensorboard", "name"]
KEY = mostly(st.sampled_from(KNOWN_KEYS), st.one_of(st.sampled_from(WEIRD_KEYS), TEXT))
VALUE = mostly(PLAUSIBLE, HOSTILE)
SET = mostly(st.tuples(KEY, VALUE).map(lambda kv: f"{kv[0]}={kv[1]}"), TEXT)

def _method_sets(name: str, values=None) -> st.SearchStrategy[list[str]]:
    """``method = name`` and a few of its own options (and ALA's, with ``+ala``), plausible or hostile."""
    import dataclasses

    base, _, tf = name.partition("+")
    keys = [f"options.{f.name}" for f in dataclasses.fields(METHODS[base].options_cls)]
    keys += [f"{tf}.{f.name}" for f in dataclasses.fields(TRANSFORMS[tf].options_cls)] if tf else []
    if not keys:
        return st.just([f'method="{name}"'])
    pair = st.tuples(st.sampled_from(keys), VALUE if values is None else values).map(lambda kv: f"{kv[0]}={kv[1]}")
    return st.lists(pair, max_size=3).map(lambda xs: [f'method="{name}"', *xs])


METHOD_NAMES = [*sorted(METHODS), "fedavg+ala", "fedprox+ala", "ditto+ala"]
METHOD_SETS = st.sampled_from(METHOD_NAMES).flatmap(_method_sets)
FILES = ['"tiny.toml"', '"run"', '"file"', '"empty"', '"run/partition.json"', '"run/metrics.jsonl"',
         '"run/checkpoint.pt"', '"notpart.json"', '"outside.json"', '"pfl"', '"pfl/train"', '"nosuch"', '""']
FILE_SETS = st.one_of(  # the fields that name a file, with files of every kind
    st.sampled_from(FILES).map(lambda f: ["partition.kind=indices", f"partition.path={f}"]),
    st.sampled_from(FILES).map(lambda f: ["method=pfedrlla", f"options.agent={f}"]))
SETS = st.tuples(st.lists(SET, max_size=3), st.one_of(st.just([]), METHOD_SETS, FILE_SETS)).map(
    lambda t: [a for item in t[1] + t[0] for a in ("--set", item)])
FLAG_VALUE = mostly(st.sampled_from(["1", "2", "3"]),
                    st.one_of(st.sampled_from(NUMBERS + ["4", "64", "1024", "1025", "", "x", "é"]), TEXT))
PATHS = ["o", "o/sub", ".", "..", "../o", "é", "a b", "-x", "", "run", "run/metrics.jsonl", "file", "empty",
         "nosuch", "o/../o2"]
PATH = mostly(st.sampled_from(["o", "o2", "o/sub", "p", "é"]),
              st.one_of(st.sampled_from(PATHS), TEXT.filter(lambda s: not s.startswith("/"))))


def _opt(flag: str, values) -> st.SearchStrategy[list[str]]:
    """``[]`` or ``[flag, value]``."""
    return st.one_of(st.just([]), values.map(lambda v: [flag, v]))


def _cat(*parts) -> st.SearchStrategy[list[str]]:
    return st.tuples(*parts).map(lambda ps: [a for p in ps for a in (p if isinstance(p, list) else [p])])


COMMANDS = ("run", "report", "partition", "methods", "configs", "sweep", "export", "bench", "pretrain", "deploy")
CONFIG = mostly(st.sampled_from([[], ["tiny.toml"]]), st.sampled_from([["nosuch.toml"], ["bad.toml"], ["run"],
                                                                       ["file"], ["é.toml"]]))
MAYBE = st.sampled_from  # readability: MAYBE([[], [...]])

RUN = _cat(st.just("run"), CONFIG, st.just(BASE), SETS, st.just(["--check"]), _opt("--out", PATH),
           _opt("--threads", FLAG_VALUE), _opt("--workers", FLAG_VALUE),
           _opt("--device", mostly(st.just("cpu"), st.sampled_from(["auto", "gpu", ""]))),
           _opt("--backend", mostly(st.sampled_from(["sequential", "processes", "vmap"]), st.just("threads"))),
           mostly(MAYBE([[], ["--force"], ["--quiet"]]), MAYBE([["--resume", "--force"], ["--frobnicate"]])))
PARTITION = _cat(st.just("partition"), CONFIG, st.just(BASE), SETS, _opt("--out", PATH), MAYBE([[], ["--force"]]),
                 st.one_of(st.just([]), st.tuples(mostly(st.just("pflib"), st.sampled_from(["csv", ""])), PATH).map(
                     lambda t: ["--export", *t])))
GRID_VALUES = st.lists(VALUE, min_size=1, max_size=3).map(",".join)
SWEEP = _cat(st.just("sweep"), mostly(st.just(["tiny.toml"]), MAYBE([["tiny.toml", "tiny.toml"], ["nosuch.toml"], [],
                                                                      ["bad.toml"]])),
             st.one_of(st.just([]), st.lists(FLAG_VALUE, min_size=1, max_size=3).map(lambda v: ["--seeds", *v])),
             st.lists(st.tuples(KEY, GRID_VALUES).map(lambda kv: ["--grid", f"{kv[0]}={kv[1]}"]),
                      max_size=2).map(lambda x: sum(x, [])),
             SETS, _opt("--jobs", FLAG_VALUE), _opt("--threads", FLAG_VALUE),
             mostly(PATH.map(lambda p: ["--out", p]), st.just([])), st.just(["--dry-run"]))
DEPLOY = _cat(st.just("deploy"), CONFIG, st.just(BASE), SETS, _opt("--nodes", FLAG_VALUE),
              _opt("--timeout", FLAG_VALUE), _opt("--min-clients", FLAG_VALUE), _opt("--threads", FLAG_VALUE),
              mostly(PATH.map(lambda p: ["--out", p]), st.just([])), st.just(["--write-app"]), PATH)
BENCH = _cat(st.just("bench"), st.just(BASE), SETS, st.just(["--rounds"]),
             st.sampled_from(["0", "-1", "1e11", "x", "", "10001", "nan"]), _opt("--threads", FLAG_VALUE))
PRETRAIN = _cat(st.just("pretrain"), st.just(BASE), SETS, _opt("--out", PATH), st.just(["--quiet"]))
REPORT = _cat(st.just("report"), st.lists(mostly(st.sampled_from(["run", "."]), PATH), min_size=0, max_size=2),
              _opt("--out", PATH), MAYBE([[], ["--no-plots"]]),
              st.one_of(st.just([]), st.tuples(mostly(st.just("synthetic"), TEXT), TEXT).map(
                  lambda ab: ["--compare", *ab])))
EXPORT = _cat(st.just("export"), mostly(st.just("tensorboard"), st.sampled_from(["csv", ""])),
              mostly(st.just("run"), PATH), _opt("--out", PATH))
SMALL = st.one_of(_cat(st.just("methods"), st.one_of(st.just([]), st.sampled_from([*METHODS, "+ala", "ala", "x"]),
                                                     TEXT)),
                  _cat(st.just("configs"), st.one_of(st.just([]), TEXT)),
                  st.sampled_from([["--version"], ["--help"], ["run", "--help"], [], ["nosuch"]]),
                  _cat(TEXT.filter(lambda t: t not in COMMANDS),
                       st.lists(st.one_of(TEXT, st.sampled_from(["run", "--set", "--out", "sweep", "-h"])), max_size=3)))
ARGV = st.one_of(RUN, RUN, RUN, PARTITION, PARTITION, SWEEP, SWEEP, DEPLOY, BENCH, PRETRAIN, REPORT, EXPORT, SMALL)


# ------------------------------------------------------------------------------------------------ harness
@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """A working directory with a tiny config, a broken one, a finished run, a file and an empty folder."""
    root = tmp_path_factory.mktemp("fuzz")
    (root / "tiny.toml").write_text('dataset = "synthetic"\nmodel = "mlp"\nrounds = 1\n[partition]\nnum_clients = 3\n'
                                    'min_samples = 5\n[log]\nplot = false\n')
    (root / "bad.toml").write_text("rounds = = 1\n")
    (root / "file").write_text("not a directory\n")
    (root / "empty").mkdir()
    (root / "notpart.json").write_text('{"spec": {}, "indices": {"train": [["a"]], "test": [[0]]}}')
    (root / "outside.json").write_text('{"indices": {"train": [[0], [1], [99999]], "test": [[2], [3], [4]]}}')
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FEDBLEND_DATA", str(root / "no-data"))  # only the synthetic dataset (see the module docstring)
        with _cwd(root):
            assert main(["run", "tiny.toml", "--out", "run", "--quiet", "--threads", "1"]) == 0
            assert main(["partition", "tiny.toml", "--export", "pflib", "pfl"]) == 0
        yield root


@contextlib.contextmanager
def _cwd(path: Path):
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def call(argv: list[str]) -> tuple[int, str, str]:
    """``main(argv)`` in-process: (exit code, stdout, stderr); torch's thread count is restored after."""
    import torch

    threads = torch.get_num_threads()
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict")
    err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="backslashreplace")
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(argv)
            except SystemExit as exc:  # argparse's --help / --version
                rc = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2
            out.flush()
            err.flush()
    finally:
        torch.set_num_threads(threads)
    return rc, out.buffer.getvalue().decode(), err.buffer.getvalue().decode()


def check(argv: list[str]) -> int:
    """The property: exit 0, or exit 2 with one ``fedblend: error:`` line last on stderr (warnings may precede it).
    ``--debug`` (the request for a traceback) is never generated."""
    argv = [a for a in argv if a != "--debug"]
    rc, _, err = call(argv)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err, (argv, err)
    assert rc in (0, 2), (argv, rc, err)
    errors = [ln for ln in lines if ln.startswith("fedblend: error: ")]
    if rc == 0:
        assert not errors, (argv, err)
    else:
        assert len(errors) == 1 and lines[-1] == errors[0], (argv, err)
        assert all(ln.startswith(("fedblend: error: ", "fedblend: warning: ")) for ln in lines), (argv, err)
    return rc


COUNT = {"cli": 0, "run": 0, "ok": 0}


@settings(max_examples=EXAMPLES, **SETTINGS)
@given(argv=ARGV)
def test_cli_fuzz(scratch, argv):
    with _cwd(scratch):
        COUNT["ok"] += check(argv) == 0
    COUNT["cli"] += 1


# real training: one round, every method, hostile values that are small or out of range (so no example is slow)
SMALL_VALUE = mostly(st.sampled_from(["0", "1", "2", "3", "5", "10", "0.1", "0.5", "0.9", "true", "false", *CHOICES]),
                     st.sampled_from(["-1", "1e11", "nan", "inf", "-inf", '"x"', "[1]", '"../x"', '"é"', "4294967296",
                                      "0.0", "1.0", "-0.0"]))
TABLE_KEYS = [k for k in KNOWN_KEYS if k.split(".")[0] in TABLES and k.split(".")[1] not in ("epochs", "num_clients")]
RUN_SETS = st.tuples(st.sampled_from(METHOD_NAMES).flatmap(lambda m: _method_sets(m, SMALL_VALUE)),
                     st.lists(st.tuples(st.sampled_from(TABLE_KEYS), SMALL_VALUE).map(lambda kv: f"{kv[0]}={kv[1]}"),
                              max_size=2)).map(lambda t: [a for item in t[0] + t[1] for a in ("--set", item)])
REAL = _cat(st.just("run"), st.just(BASE), RUN_SETS,
            st.just(["--set", "rounds=1", "--set", "train.epochs=1", "--quiet", "--threads", "1", "--force"]),
            st.sampled_from(["real", "real-2"]).map(lambda o: ["--out", o]))


@settings(max_examples=max(6, EXAMPLES // 10), **SETTINGS)
@given(argv=REAL)
def test_run_fuzz(scratch, argv):
    with _cwd(scratch):
        check(argv)
    COUNT["run"] += 1


def test_fuzz_reached_both_outcomes():
    """The generator is not degenerate: the default budget produced runs that succeed and inputs refused."""
    if COUNT["cli"] == 0:
        pytest.skip("run with the fuzz tests")
    print(f"fuzz: {COUNT['cli']} command lines ({COUNT['ok']} ran, {COUNT['cli'] - COUNT['ok']} refused), "
          f"{COUNT['run']} real runs")
    assert 0 < COUNT["ok"] < COUNT["cli"], COUNT


def test_property_catches_a_traceback(scratch, monkeypatch):
    """The harness fails on what the property forbids: an uncaught exception, exit 1, or two error lines."""
    import fedblend.cli.main as cli

    def boom(args):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(cli, "_dispatch", boom)
    with pytest.raises(ZeroDivisionError), _cwd(scratch):
        check(["run", "--check"])
    monkeypatch.undo()
    with _cwd(scratch), pytest.raises(AssertionError):
        check(["run", "tiny.toml", "--resume", "--out", "nosuch", "--check"])  # exit 1: no checkpoint to resume
