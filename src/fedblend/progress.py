"""The terminal progress display of a run (``fedblend run``, ``pretrain``, ``deploy``; the notebook API's bars
reuse its client bar): reads the round's metrics and counts client jobs, never changes a result."""

from __future__ import annotations

import os
import shutil
import sys
import time
from typing import Any


def _columns(stream) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (OSError, AttributeError, ValueError):
        return shutil.get_terminal_size().columns


class Progress:
    """The progress display on stderr (``tqdm``): on a terminal a round bar (accuracy, loss, seconds per round,
    elapsed, eta) and under it a bar of the clients of the current round or evaluation, both fitted to the
    terminal's width; not on a terminal, one plain line per round with the same numbers and no bars. It reads
    the round's metrics and counts client jobs (``Simulation.on_client``); it never changes a result."""

    def __init__(self, total: int, label: str, stream=None):
        self.total, self.label = total, label
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.t0 = time.perf_counter()
        self.last_acc: float | None = None
        self.rounds = self.clients = None
        if self.tty:
            from tqdm import tqdm

            common = {"file": self.stream, "dynamic_ncols": True, "mininterval": 0.2}
            room = max(12, _columns(self.stream) - 68)  # the numbers need about 66 columns
            desc = label if len(label) <= room else label[: room // 2 - 1] + "~" + label[-(room - room // 2):]
            self.rounds = tqdm(total=total, desc=desc, unit="round", position=0, leave=True, **common,
                               bar_format="{desc} {n_fmt}/{total_fmt} |{bar}|{postfix} [{elapsed}<{remaining}]")
            self.clients = tqdm(total=0, desc="clients", unit="client", position=1, leave=False, **common,
                                bar_format="  {desc} {n_fmt}/{total_fmt} |{bar}| {rate_fmt}")

    def on_client(self, kind: str, n: int) -> None:
        """``Simulation.on_client``: a phase with ``n`` client jobs starts, or one job (client ``n``) is done."""
        if self.clients is None:
            return
        if kind == "done":
            self.clients.update(1)
        else:
            self.clients.reset(total=n)
            self.clients.set_description_str(f"{kind} clients", refresh=False)

    def numbers(self, m: dict) -> tuple[str, float, float, float]:
        """(accuracy text, seconds this round, elapsed seconds, eta seconds) after round ``m``."""
        if "acc" in m:
            self.last_acc = m["acc"]
        per = m["seconds"] + m.get("eval_seconds", 0.0)
        acc = f"acc {self.last_acc:.4f}" if self.last_acc is not None else "acc   -   "
        return acc, per, time.perf_counter() - self.t0, per * (self.total - m["round"])

    def __call__(self, m: dict, sim: Any = None) -> None:
        done = m["round"]
        acc, per, el, eta = self.numbers(m)
        if self.rounds is not None:
            self.rounds.set_postfix_str(f"{acc} loss {m['train_loss']:.4f} {per:.2f}s/round", refresh=False)
            self.rounds.update(done - self.rounds.n)
            if done == self.total:
                self.close()
            return
        frac = done / self.total
        bar = "#" * int(20 * frac) + "-" * (20 - int(20 * frac))
        self.stream.write(f"{self.label} [{bar}] round {done}/{self.total} {acc} loss {m['train_loss']:.4f} "
                          f"{per:.2f}s/round elapsed {el:.0f}s eta {eta:.0f}s\n")
        self.stream.flush()

    def close(self) -> None:
        for bar in (self.clients, self.rounds):
            if bar is not None:
                bar.close()
        self.rounds = self.clients = None
