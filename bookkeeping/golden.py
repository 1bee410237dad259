"""Golden outputs: record and check the per-round metrics of every benchmark config (3 rounds, seed 0).

Refactors of the engine or the method interface must not move any result. ``record`` runs each config through
the ``fedblend run`` command (the stable run contract) for 3 rounds at seed 0 with one thread and writes its
``metrics.jsonl`` without wall-clock fields to ``tests/golden/benchmarks/<stem>.jsonl``; ``check`` runs them
again and compares every remaining field: discrete fields exactly, floats within the cross-machine tolerance of
``fedblend.common.histories`` (the committed goldens were recorded on another CPU), or bit for bit with ``--exact``.

A refactor is proven on one machine: record the old code's goldens into a scratch folder, change the code, check
against that folder with ``--exact``:

    python bookkeeping/golden.py record configs/benchmarks/*.toml --jobs 2 --golden /tmp/before
    python bookkeeping/golden.py check configs/benchmarks/*.toml --jobs 2 --golden /tmp/before --exact
    python bookkeeping/golden.py check configs/benchmarks/*.toml --jobs 2 [--set backend=processes ...]

``--set`` / ``--args`` apply in both modes: record a variant with ``--set options.storage=trained`` and check it
with the same ``--set``; check the default goldens with ``--set backend=processes`` to prove a backend equal.

Extra cases (``EXTRA``) run a config with overrides, e.g. FedALP with a warm-up short enough that its
clustered phase is inside the 3 rounds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fedblend.common.histories import diff_histories

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib


REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "golden" / "benchmarks"
BASE = ["rounds=3", "seed=0"]
# name -> (config stem, extra overrides): phases the plain 3-round runs never reach
EXTRA = {
    "t2-mnist-mlp-fedalp@tpre2": ("t2-mnist-mlp-fedalp", ["options.t_pre=2"]),
    "t2-mnist-mlp-fedalp-m3@tpre1-recluster": ("t2-mnist-mlp-fedalp-m3", ["options.t_pre=1", "options.recluster_every=1"]),
    "t2-fmnist-mlp-fedalp@tpre2-ala": ("t2-fmnist-mlp-fedalp", ["options.t_pre=2", "method=\"fedalp+ala\""]),
}


#: the line a float-only difference ends with
FLOATS_ONLY = ("only floats differ, beyond the cross-machine tolerance; on another CPU than the goldens' one, prove "
               "a change with the same-machine --exact procedure (docs/architecture.md)")


def strip(row: dict) -> dict:
    """A metrics row without wall-clock fields (``*seconds*`` and the ``*_share`` derived from them) and without
    the per-client fields added after the goldens were recorded (``per_client``, ``global_per_client``: the counts
    the pooled fields are summed from; see ``fedblend.common.histories.without_per_client``)."""
    return {k: v for k, v in row.items() if "seconds" not in k and not k.endswith("_share")
            and not k.endswith("per_client")}


def recorded_protocol(config: Path, overrides: list[str]) -> list[str]:
    """Overrides that restore the evaluation protocol the goldens were recorded with: ALA evaluated from the eval
    stream (``eval_stream = "eval"``; the default became ``"train"`` afterwards, which changes only the
    personalized evaluation fields, see tests/test_golden.py)."""
    method = tomllib.loads(config.read_text()).get("method", "fedavg")
    for o in overrides:
        if o.startswith("method="):
            method = o.split("=", 1)[1].strip('"\'')
    if method == "fedala":
        return ['options.eval_stream="eval"']
    if "ala" in method.split("+"):
        return ['ala.eval_stream="eval"']
    return []


def run_case(config: Path, overrides: list[str], extra_args: list[str]) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "fedblend.cli.main", "run", str(config), "--out", tmp, "--threads", "1",
               "--quiet"]
        for o in BASE + overrides + recorded_protocol(config, overrides):
            cmd += ["--set", o]
        cmd += extra_args
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"{config.name} {overrides}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
        return [strip(json.loads(line)) for line in (Path(tmp) / "metrics.jsonl").read_text().splitlines()]


def cases(configs: list[str]) -> dict[str, tuple[Path, list[str]]]:
    out = {Path(c).stem: (Path(c), []) for c in configs}
    stems = {Path(c).stem: Path(c) for c in configs}
    for name, (stem, over) in EXTRA.items():
        if stem in stems:
            out[name] = (stems[stem], over)
    return out


def compare(want: list[dict], got: list[dict], exact: bool = False) -> list[str]:
    """Differences (golden != now), within the cross-machine tolerance unless ``exact``."""
    return diff_histories(want, got, exact=exact)


def only_floats_differ(want: list[dict], got: list[dict]) -> bool:
    """True when the histories differ but only in float values (any two finite floats count as equal here):
    every round, sampled client, byte count and key matches. On a CPU other than the goldens' (e.g. AVX2
    against AVX-512 kernels) the last-bit differences of a first operation grow through a round's SGD steps,
    and can exceed the cross-machine tolerance (seen: t3-mnist-pat-fedavg's round-1 ``train_loss`` 0.22304 against
    the golden's 0.22251 on an AVX2 machine, before any change); there the proof of a change is the same-machine
    ``--exact`` procedure (module docstring)."""
    return bool(compare(want, got, exact=True)) and not diff_histories(want, got, rel=1.0, abs_=math.inf)


def _slow_first(item):
    """T3 (cnn4, batch 10) runs take longest: start them first."""
    return (not item[0].startswith("t3"), item[0])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["record", "check"])
    ap.add_argument("configs", nargs="+")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--golden", default=str(GOLDEN))
    ap.add_argument("--set", dest="sets", action="append", default=[],
                    help="extra --set for every case, in record and check alike (e.g. backend, or an option)")
    ap.add_argument("--args", default="", help="extra CLI arguments for every case, e.g. '--backend processes'")
    ap.add_argument("--exact", action="store_true", help="check bit for bit (goldens recorded on this machine)")
    args = ap.parse_args(argv)
    golden = Path(args.golden)
    golden.mkdir(parents=True, exist_ok=True)
    todo = cases(args.configs)
    extra = args.args.split() if args.args else []

    def one(item):
        name, (cfg, over) = item
        try:
            if args.mode == "record":
                rows = run_case(cfg, over + args.sets, extra)
                (golden / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
                return name, []
            want = [json.loads(x) for x in (golden / f"{name}.jsonl").read_text().splitlines()]
            got = run_case(cfg, over + [f for f in args.sets], extra)
            diffs = compare(want, got, args.exact)
            if diffs and not args.exact and only_floats_differ(want, got):
                diffs = diffs[:9] + [FLOATS_ONLY]
            return name, diffs or ([] if args.exact or not compare(want, got, True) else ["<within tolerance>"])
        except Exception as exc:  # report and go on with the other cases
            return name, [f"error: {exc}"]

    bad = close = floats = 0
    with ThreadPoolExecutor(args.jobs) as pool:
        for name, diffs in pool.map(one, sorted(todo.items(), key=_slow_first)):
            if diffs == ["<within tolerance>"]:
                print(f"ok~ {name} (floats within tolerance, not bit for bit)", flush=True)
                close += 1
                continue
            print(f"{'ok ' if not diffs else 'DIFF'} {name}" + "".join(f"\n     {d}" for d in diffs[:10]), flush=True)
            bad += bool(diffs)
            floats += diffs[-1:] == [FLOATS_ONLY]
    if args.mode == "check":
        print(f"{len(todo) - bad} identical ({len(todo) - bad - close} bit for bit, {close} within tolerance), "
              f"{bad} different" + (f" ({floats} of them in float values only: {FLOATS_ONLY})" if floats else ""))
    else:
        print(f"{len(todo) - bad} recorded, {bad} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
