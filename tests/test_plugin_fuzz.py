"""Property-based fuzz (hypothesis) of a plug-in's behaviour: a plug-in method (``tests/plugin_faults.py``) with
one fault planted in one of its hooks -- it raises, returns None or the wrong kind of object (its value in a list,
or a plausible wrong type of its own: ``tests/wrong_returns.py``), returns a model with
a wrong shape, an integer dtype, NaN, a parameter too many or too few, a reply with zero samples, or the hook takes
the wrong parameters -- in a chosen round, for one client or all, run through ``fedblend run`` in process
(``sequential`` and ``vmap`` backends; worker processes and Flower nodes are tested in
``tests/test_user_code_guarded.py``).

Every case ends in one of two ways:

* exit 1 with exactly one ``fedblend: error:`` line (warnings aside) and no traceback, naming the plug-in
  (``faulty-plugin``) and, for a fault that is not a NaN, the hook or the reply it broke -- for a fault in what a
  hook returns (None, the wrong type), once applied always, and naming the hook that returned it
  (``"<hook> returned ..."``), not a later one that used it; a NaN (a model or an update of NaN) may instead
  stop the run as diverged, which is how fedblend treats NaN wherever it comes from;
* exit 0, and then the run is correct: when the fault was applied, the metrics equal those of the run without it,
  bit for bit on the sequential backend -- except for the one fault that is a legitimate method, a reply without
  one parameter from every client of a round (a partial upload: the server keeps its value for it, as a
  ``shares = "body"`` method does).

Nothing is silently wrong: a run that finishes on a broken model is a failure of this test.

The space: 12 hooks x 11 faults x 2 rounds x 4 client choices x 2 backends = 2,112 cases. Budget:
``FEDBLEND_PLUGIN_FUZZ_EXAMPLES`` examples (default 30, derandomized, about 20 s here); set it for a long random
search, e.g. ``FEDBLEND_PLUGIN_FUZZ_EXAMPLES=2200 python -m pytest tests/test_plugin_fuzz.py``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis", reason="the fuzz needs hypothesis (pip install -e '.[dev]')")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from fedblend.cli.main import main  # noqa: E402
from tests import plugin_faults  # noqa: E402
from tests.plugin_faults import FAULTS, HOOKS, RETURN_FAULTS, Faulty  # noqa: E402

EXAMPLES = int(os.environ.get("FEDBLEND_PLUGIN_FUZZ_EXAMPLES", "30"))
LONG = "FEDBLEND_PLUGIN_FUZZ_EXAMPLES" in os.environ
BASE = ["run", "--set", "method=tests.plugin_faults:Faulty", "--set", "dataset=synthetic", "--set", "model=mlp",
        "--set", "rounds=2", "--set", "partition.num_clients=3", "--set", "partition.min_samples=5",
        "--set", "log.plot=false", "--quiet"]
#: (hook, fault, every client): faults that are legitimate method behaviour (module docstring)
LEGITIMATE = {("reply", "missing", True)}

pytestmark = pytest.mark.usefixtures("one_thread")


def run(backend: str, options: dict | None = None) -> tuple[int, list[str], bool, list[dict]]:
    """``fedblend run`` of the faulty plug-in: (exit code, stderr lines that are not warnings, whether the fault
    was applied, the metrics rows without timings)."""
    sets = [x for k, v in (options or {}).items() for x in ("--set", f"options.{k}={json.dumps(v)}")]
    Faulty.fired = False
    err = io.StringIO()
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stderr(err), \
            contextlib.redirect_stdout(io.StringIO()):
        rc = main([*BASE, "--set", f"backend={backend}", *sets, "--out", str(Path(tmp) / "run")])
        path = Path(tmp) / "run" / "metrics.jsonl"
        rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    lines = [ln for ln in err.getvalue().splitlines() if ln.strip() and not ln.startswith("fedblend: warning:")]
    rows = [{k: v for k, v in r.items() if "seconds" not in k and not k.endswith("_share")} for r in rows]
    return rc, lines, plugin_faults.Faulty.fired, rows


_CLEAN: dict[str, list[dict]] = {}


def clean(backend: str) -> list[dict]:
    if backend not in _CLEAN:
        rc, lines, _, rows = run(backend)
        assert rc == 0 and not lines, lines
        _CLEAN[backend] = rows
    return _CLEAN[backend]


@settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=not LONG, print_blob=True,
          suppress_health_check=list(HealthCheck))
@given(hook=st.sampled_from(HOOKS), fault=st.sampled_from(FAULTS), rnd=st.integers(0, 1),
       client=st.integers(-1, 2), backend=st.sampled_from(["sequential", "vmap"]))
def test_a_faulty_plugin_is_named_or_runs_correctly(hook, fault, rnd, client, backend):
    options = {"hook": hook, "fault": fault, "round": rnd, "client": client}
    rc, lines, fired, rows = run(backend, options)
    case = f"{options} on {backend}: exit {rc}, {lines}"
    assert rc in (0, 1), case
    assert not any("Traceback" in ln for ln in lines), case
    if fired and fault in RETURN_FAULTS:  # named at the hook that returned it, whichever hook uses it next
        assert rc == 1 and len(lines) == 1 and f"'faulty-plugin' (tests.plugin_faults:Faulty): {hook} returned " \
            in lines[0], case
    if rc == 1:
        assert len(lines) == 1 and lines[0].startswith("fedblend: error: "), case
        line = lines[0]
        assert "faulty-plugin" in line, case  # a NaN it made too: "the run diverged ... [method plug-in ...]"
        if line.startswith("fedblend: error: method plug-in 'faulty-plugin'"):  # a HookError: names the hook
            assert " raised in " in line or " returned " in line or " is " in line, case
        else:  # a reply that breaks the contract, or a NaN that stopped the run (fedblend's lines for any NaN)
            nan = " has NaN or inf values " in line or ": the run diverged: " in line
            assert "'s reply in round" in line or (fault == "nan" and nan), case
        return
    assert not lines, case
    if not fired:
        return  # the fault's moment never came (a round or client the hook does not run for): a clean run
    if (hook, fault, client < 0) in LEGITIMATE:
        return
    if backend != "sequential":  # compared bit for bit where results are exact: the same case, sequentially
        rc, lines, fired, rows = run("sequential", options)
        assert rc == 0 and not lines, case
    assert rows == clean("sequential"), f"{case}: finished with results that differ from the clean run's"
