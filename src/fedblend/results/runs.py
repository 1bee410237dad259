"""Reading run directories: the one reader of ``summary.json``, ``metrics.jsonl`` and the resolved config that
``fedblend report``, the notebook API (:func:`fedblend.api.open_run`), the figures and the scripts share.

A run directory is what ``fedblend run`` writes (its writer side, the lock and what a run owns, is
:mod:`fedblend.rundir`; the files themselves are written by :mod:`fedblend.experiment`). The readers are made for
damaged and partial runs: a run without a summary is *unfinished* and listed with its last round
(:func:`unfinished`); a summary that is not a JSON object is one :class:`~fedblend.common.errors.UserFileError`
naming the file and the fix; a summary that parses but holds a field of the wrong type is left out of the table
with one line (:func:`skip_reason`, :mod:`fedblend.results.schema`); a ``metrics.jsonl`` line being written right
now is left out (:func:`read_metrics`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from fedblend.common.errors import ConfigError, UserFileError
from fedblend.common.jsonio import read_json_object, read_jsonl
from fedblend.config import config_hash, migrate_eval, with_new_defaults
from fedblend.results.schema import summary_problems

MARKERS = ("summary.json", "metrics.jsonl")  # a directory holding either is a run (finished or not)


def is_run(p: Path) -> bool:
    """Whether ``p`` holds a run (``summary.json`` or ``metrics.jsonl``), finished or not."""
    return any((Path(p) / m).exists() for m in MARKERS)


def find_runs(paths: list[str | Path]) -> list[Path]:
    """Every run directory (holding ``summary.json`` or ``metrics.jsonl``) under the given paths."""
    runs: list[Path] = []
    for p in map(Path, paths):
        if is_run(p):
            runs.append(p)
        elif p.is_dir():
            runs += sorted({q.parent for m in MARKERS for q in p.rglob(m)})
        else:
            raise UserFileError(f"{p}: not a run directory (no summary.json or metrics.jsonl) nor a folder of runs")
    return runs


def _fix(run: Path) -> str:
    return (f"summary.json is written by fedblend at the end of a run: run it again ({run}/config.toml with "
            f"--force), or leave {run} out of the report")


def read_summary(run: Path, fix: str | None = None) -> dict[str, Any]:
    """A run's ``summary.json`` ({} when there is none); :class:`UserFileError` names the file and the fix
    (``fix``, else the report's) when it is not a JSON object. Its fields are checked where they are used
    (:func:`skip_reason`)."""
    path = Path(run) / "summary.json"
    if not path.exists():
        return {}
    return read_json_object(path, fix or _fix(run))


def skip_reason(run: Path, summary: dict) -> str | None:
    """Why a finished run's summary cannot make a table row (a field missing or of the wrong type,
    :func:`~fedblend.results.schema.summary_problems`), as one line naming the file and the fix; None if it
    can."""
    problems = summary_problems(summary)
    if not problems:
        return None
    return f"skipped {run / 'summary.json'}: {'; '.join(problems)} (not a fedblend summary); {_fix(run)}"


def read_metrics(run: Path, fix: str | None = None) -> list[dict[str, Any]]:
    """A run's ``metrics.jsonl`` rows ([] when there is none); a last line being written right now is left out,
    any other damaged line is a :class:`UserFileError` naming the file, the line and the fix (``fix``, else how to
    continue the run or leave it out of the report)."""
    path = Path(run) / "metrics.jsonl"
    if not path.exists():
        return []
    return read_jsonl(path, fix or f"continue the run (fedblend run {run}/config.toml --out {run} --resume "
                                    f"rewrites metrics.jsonl from its checkpoint), delete the line, or leave {run} "
                                    f"out of the report", partial_last=True)


def group_key(summary: dict) -> tuple[str, str]:
    """(label, hash of the resolved config without its seed, and of the input files' sha256 where the run
    recorded any): the seeds of one config share it; runs made with another file at a path the config names (a
    re-made agent or init file) are another row."""
    run = summary.get("run")
    cfg = run.get("config") if isinstance(run, dict) else None
    if not isinstance(cfg, dict):
        return summary.get("label", summary.get("method", "?")), "-"
    keyed = _same_spelling({k: v for k, v in cfg.items() if k != "seed"})
    inputs = run.get("inputs")
    if isinstance(inputs, dict) and inputs:
        keyed["inputs"] = {k: v.get("sha256") if isinstance(v, dict) else v for k, v in inputs.items()}
    return summary.get("label", summary["method"]), config_hash(keyed)


def _same_spelling(cfg: dict) -> dict:
    """``cfg`` with a per-method evaluation option of an older run moved to ``[eval] model``
    (:func:`fedblend.config.migrate_eval`), an unset ``model`` left out, and options added since at their defaults
    (:func:`fedblend.config.with_new_defaults`), so that the seeds of one config made before and after such a
    change share a row."""
    try:
        cfg, _ = migrate_eval(cfg)
    except ConfigError:
        return cfg
    cfg = with_new_defaults(cfg)
    ev = cfg.get("eval")
    if isinstance(ev, dict) and ev.get("model") is None:
        cfg = {**cfg, "eval": {k: v for k, v in ev.items() if k != "model"}}
    return cfg


def last_round(run: Path) -> int:
    """The last round recorded in a run's ``metrics.jsonl`` (0 when none)."""
    rows = read_metrics(run)
    return max((r["round"] for r in rows if "stopped" not in r and isinstance(r.get("round"), int)), default=0)


def unfinished(runs: list[Path]) -> list[dict[str, Any]]:
    """Runs without a finished summary: their directory, status and last recorded round."""
    out = []
    for r in runs:
        s = read_summary(r)
        if s.get("status", "finished") != "finished" or not s:
            out.append({"dir": str(r), "status": s.get("status", "unfinished"), "last_round": last_round(r),
                        "reason": s.get("stop_reason") or s.get("degraded") or ""})
    return out


def run_config(run: Path) -> dict:
    """A run directory's resolved config (``summary.json``'s, else ``config.toml``), {} if neither (or neither
    can be read: a figure's title or a diagnostic's options are no reason to fail)."""
    try:
        summary = read_summary(run)
    except UserFileError:
        summary = {}
    run_info = summary.get("run")
    cfg = run_info.get("config") if isinstance(run_info, dict) else None
    if cfg and isinstance(cfg, dict):
        return cfg
    c = Path(run) / "config.toml"
    if not c.exists():
        return {}
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    try:
        return tomllib.loads(c.read_text())
    except (tomllib.TOMLDecodeError, OSError, UnicodeDecodeError):
        return {}
