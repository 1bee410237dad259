"""The rounds of a run: each round's row appended to ``metrics.jsonl`` and handed to the trackers and the progress
display, a diverged or non-finite stop recorded, the summary written; the Ctrl-C message saying how to go on."""

from __future__ import annotations

import time
from pathlib import Path

from fedblend.common import files
from fedblend.common.errors import DivergedError, NonFiniteError
from fedblend.common.guard import guarded
from fedblend.common.jsonio import dumps
from fedblend.config import RunConfig
from fedblend.core.engine import Simulation
from fedblend.experiment.outputs import finish
from fedblend.experiment.summary import summarize


def run_loop(cfg: RunConfig, sim: Simulation, out: Path, identity: dict, progress, stop_after,
             trackers: list = (), ck_files: dict | None = None) -> dict:
    """The rounds from ``sim.next_round`` on, each row appended to ``metrics.jsonl`` and handed to the trackers and
    ``progress``; the summary (written, with ``metrics.csv``, also when the run diverged, which then raises).
    ``stop_after`` rounds end the call early (``{"stopped_at": round}``)."""
    t0 = time.perf_counter()
    done = 0

    def on_round(m: dict) -> None:
        nonlocal done
        files.append_text(out / "metrics.jsonl", dumps(m) + "\n")
        for tr in trackers:
            with guarded(tr, "tracker", "log", m["round"] - 1, side=""):
                tr(m)
        done += 1
        if progress is not None:
            progress(m, sim)
        if stop_after is not None and done >= stop_after and sim.next_round < cfg.rounds:
            raise _Stop()

    try:
        with sim:
            sim.run(on_round, checkpoint_dir=out, checkpoint_every=cfg.checkpoint_every,
                    extra_state={"identity": identity, "files": ck_files or {}})
    except _Stop:
        return {"stopped_at": sim.next_round}
    except DivergedError as exc:
        if isinstance(exc, NonFiniteError):  # stopped inside the round, before aggregating
            files.append_text(out / "metrics.jsonl", dumps(
                {"round": exc.round, "stopped": "nonfinite", "nonfinite_clients": [exc.client], "tensor": exc.tensor,
                 "on_nonfinite": "stop"}) + "\n")
        elif sim.history and sim.history[-1].get("diverged"):  # the diverged round's row, then the stop
            files.append_text(out / "metrics.jsonl", dumps(sim.history[-1]) + "\n")
            files.append_text(out / "metrics.jsonl", dumps({"round": exc.round, "stopped": "diverged",
                                                            "reason": exc.reason}) + "\n")
        summary = summarize(cfg, sim, time.perf_counter() - t0)
        summary.update(status="diverged", stop_reason=str(exc), divergence={"round": exc.round, "reason": exc.reason})
        if isinstance(exc, NonFiniteError):
            summary["nonfinite"] = {"round": exc.round, "client": exc.client, "tensor": exc.tensor}
        finish(out, sim, summary, identity)
        raise
    summary = summarize(cfg, sim, time.perf_counter() - t0)
    if sim.diverged is not None:  # on_divergence = "warn": the run went on, but it is no result
        d = sim.diverged
        summary.update(status="diverged", divergence=d, stop_reason=f"round {d['round']}: {d['reason']}")
        finish(out, sim, summary, identity)
        named = getattr(sim, "diverged_named", "")  # the method, and where the first non-finite value appeared
        raise DivergedError(f"round {d['round']}: the run diverged: {d['reason']}{' ' + named if named else ''}. It "
                            f"went on to round "
                            f"{sim.next_round} (on_divergence = 'warn'), and its summary says status 'diverged' "
                            f"(no result)", d["round"], d["reason"])
    finish(out, sim, summary, identity)
    return summary


def interrupted_message(cfg: RunConfig, sim: Simulation, out: Path, start: int, nothing_kept: bool,
                        command: str) -> str:
    """The Ctrl-C message: after which round, and the command that resumes (or, without a checkpoint, restarts)."""
    n = sim.next_round
    if nothing_kept:
        return f"interrupted before round 1 finished; nothing was kept in {out}"
    k = cfg.checkpoint_every
    last_ck = max(start, (n // k) * k) if k > 0 else start
    if last_ck == 0:
        return (f"interrupted after round {n}; no checkpoint was written yet (checkpoint_every = {k}), so it "
                f"cannot be resumed: run again with: {command} --force")
    return (f"interrupted after round {n}; resume with: {command} --resume"
            + (f" (continues from the checkpoint of round {last_ck})" if last_ck != n else ""))


class _Stop(Exception):
    pass
