"""Every file generated from the registered methods, in one command: what a new built-in method needs beyond its
module, its test and its doc page (docs/architecture.md, "New built-in method checklist").

    python bookkeeping/regenerate.py            # write what is stale or missing
    python bookkeeping/regenerate.py --check    # write nothing; exit 1 naming each stale or missing file

It writes

* the generated blocks of docs/config.md, docs/architecture.md and README.md (``bookkeeping/gen_docs.py``: option
  tables, ``[eval] model`` rows, the hook table, the README's methods table from the method pages);
* ``configs/methods/<name>.toml``, one bundled config per built-in method (``bookkeeping/make_method_configs.py``);
* the synthetic goldens of the specs that have none (``tests/golden/record_synthetic.py``: each new method, and
  ``<name>+ala`` where ALA can run on it). Only missing histories are recorded: an existing golden is never
  rewritten (it keeps the code it was recorded with as its reference); ``record_synthetic.py --all`` is the
  deliberate way to re-record.

A separate command from ``gen_docs.py``: that one only renders text from the code (fast, and what the docs tests
import); recording a golden runs the shared suite's simulations of the new specs (seconds each).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bookkeeping")]

import gen_docs  # noqa: E402 - a sibling script (bookkeeping/ is not a package)
import make_method_configs  # noqa: E402

GOLDEN = ROOT / "tests" / "golden" / "synthetic.json"
CONFIGS = ROOT / "configs" / "methods"


def stale_configs() -> dict[Path, str]:
    """``{path: text}`` of the bundled method configs that are missing or differ from what the generator writes."""
    texts = {CONFIGS / fname: text for fname, text in make_method_configs.configs().items()}
    return {p: t for p, t in texts.items() if not p.is_file() or p.read_text() != t}


def missing_goldens() -> list[str]:
    """The golden cases (``"<spec>/<case>"``) of registered specs that ``tests/golden/synthetic.json`` lacks."""
    from tests.golden.record_synthetic import keys

    have = json.loads(GOLDEN.read_text()) if GOLDEN.is_file() else {}
    return [k for k in keys() if k not in have]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], prog="python bookkeeping/regenerate.py")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a generated file is stale")
    args = ap.parse_args(argv)
    docs = [(path, new) for path, _, new in gen_docs.stale()]
    configs = stale_configs()
    goldens = missing_goldens()
    stale = [path.relative_to(ROOT) for path, _ in docs] + [p.relative_to(ROOT) for p in configs] + \
            ([f"{GOLDEN.relative_to(ROOT)} (no history for {', '.join(goldens)})"] if goldens else [])
    if not args.check and goldens:
        stale[-1] = f"{GOLDEN.relative_to(ROOT)} (recorded {', '.join(goldens)})"
    if args.check:
        for what in stale:
            print(f"{what} is stale: run python bookkeeping/regenerate.py", file=sys.stderr)
        return 1 if stale else 0
    for path, new in docs:
        path.write_text(new)
    for path, text in configs.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    if goldens:
        from tests.golden import record_synthetic

        record_synthetic.main(str(GOLDEN))  # records the missing cases only; the others are kept as they are
    for what in stale:
        print(f"wrote {what}")
    print("up to date" if not stale else f"{len(stale)} file(s) written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
