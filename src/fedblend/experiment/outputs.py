"""Writing the results directory's files (each through a temporary file and a rename): the metrics rewritten on
``--resume``, ``metrics.csv`` and ``summary.json`` at the end; where a run without ``--out`` goes."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from fedblend.common import files
from fedblend.common.jsonio import dumps
from fedblend.config import RunConfig
from fedblend.core.engine import Simulation
from fedblend.rundir import clear_run, holds_run, locked_by


def default_out_dir(cfg: RunConfig, base: str | Path = "runs") -> Path:
    """``runs/<label>-seed<N>``, or the first of ``...-2``, ``...-3``, ... that holds no run: a run without
    ``--out`` never lands on an earlier one."""
    stem = Path(base) / f"{cfg.label}-seed{cfg.seed}"
    out, k = stem, 1
    while holds_run(out) or (out.exists() and not out.is_dir()) or locked_by(out) is not None:
        k += 1
        out = stem.with_name(f"{stem.name}-{k}")
    return out


def write(path: Path, text: str) -> None:
    """Write ``text`` through a temporary file and a rename, so a failed write leaves the old file whole (and no
    temporary file)."""
    files.write_atomic(path, text.encode())


def clear(out: Path, created: bool) -> None:
    """Remove what a run owns in ``out`` (a failed fresh run's files, or the old run on ``--force``: files,
    client folders, TensorBoard events; :func:`fedblend.rundir.clear_run`). The directory itself, when this run
    created it, goes when its lock is released and it is empty."""
    clear_run(out)


def finish(out: Path, sim: Simulation, summary: dict, identity: dict) -> None:
    """The end of a run's files: the identity into the summary, ``metrics.csv``, ``summary.json``."""
    summary.update(config_hash=identity["config_hash"], run=identity)
    write_csv(out / "metrics.csv", sim.history)
    write(out / "summary.json", dumps(summary, indent=2) + "\n")


def rewrite_metrics(out: Path, history: list[dict]) -> None:
    """``metrics.jsonl`` as the checkpoint's history has it (``--resume``: rows after its round go)."""
    write(out / "metrics.jsonl", "".join(dumps(m) + "\n" for m in history))


def write_csv(path: Path, history: list[dict]) -> None:
    """``metrics.csv``: the scalar columns of every row, and the selected clients' count and bytes."""
    keys: list[str] = []
    for m in history:
        for k, v in m.items():
            if not isinstance(v, (list, dict)) and k not in keys:
                keys.append(k)
    keys += ["num_selected", "bytes_down_total", "bytes_up_total"]
    f = io.StringIO(newline="")
    w = csv.DictWriter(f, fieldnames=keys)
    w.writeheader()
    for m in history:
        row = {k: m.get(k, "") for k in keys}
        row.update(num_selected=len(m["selected"]), bytes_down_total=sum(m["bytes_down"]),
                   bytes_up_total=sum(m["bytes_up"]))
        w.writerow(row)
    files.write_atomic(path, f.getvalue().encode())
