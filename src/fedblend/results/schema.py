"""What ``fedblend report`` needs of a finished run's ``summary.json``, checked field by field.

A summary that is not JSON at all is a damaged file (:func:`fedblend.results.runs.read_summary` refuses it, exit 2);
one that parses but holds a field of the wrong type (``"best_accuracy": "0.93"``, a seed written as a string) or
lacks one the table needs used to stop the report with a traceback deep in the averaging. Such a run is now left
out of the table with one line naming the file, the field and what it holds, and the report goes on with the
other runs (:func:`summary_problems`).
"""

from __future__ import annotations

from typing import Any

NUMBER = "a number"
INT = "an integer"
TEXT = "a string"

#: field -> what it must hold; a finished run's table row reads each
REQUIRED = {"method": TEXT, "seed": INT, "rounds": INT, "best_accuracy": NUMBER, "final_accuracy": NUMBER,
            "seconds_per_round": NUMBER}
#: read where present (None allowed)
OPTIONAL = {"label": TEXT, "status": TEXT, "global_best_accuracy": NUMBER, "global_final_accuracy": NUMBER,
            "final_acc_client_worst": NUMBER, "final_acc_client_p10": NUMBER, "target_accuracy": NUMBER,
            "rounds_to_target": INT}


def _fits(value: Any, kind: str) -> bool:
    if isinstance(value, bool):
        return False
    if kind == NUMBER:
        return isinstance(value, (int, float))
    if kind == INT:
        return isinstance(value, int)
    return isinstance(value, str)


def summary_problems(summary: dict) -> list[str]:
    """Each field of a finished run's summary that the report cannot use, as ``"'best_accuracy' is a str
    ('0.93'), not a number"``; [] when every field fits. The accuracies may be null (no evaluation)."""
    out = [f"has no {k!r}" for k in REQUIRED if k not in summary]
    for fields, none_ok in ((REQUIRED, ("best_accuracy", "final_accuracy", "seconds_per_round")), (OPTIONAL, OPTIONAL)):
        for k, kind in fields.items():
            v = summary.get(k)
            if k in summary and not (v is None and k in none_ok) and not _fits(v, kind):
                shown = repr(v) if len(repr(v)) <= 40 else repr(v)[:37] + "..."
                out.append(f"{k!r} is {'null' if v is None else f'a {type(v).__name__} ({shown})'}, not {kind}")
    run = summary.get("run")
    if run is not None and not isinstance(run, dict):
        out.append(f"'run' is a {type(run).__name__}, not an object")
    return out
