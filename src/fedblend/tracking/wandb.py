"""Weights & Biases: ``[log] wandb = true`` logs a run to W&B (``pip install 'fedblend[wandb]'``), offline by
default (files in ``OUT/wandb``; ``wandb sync OUT/wandb/offline-run-*`` uploads them later), with the resolved
config; :func:`read_wandb_offline` reads an offline run's history back with W&B's own record schema."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from fedblend.common.optional import require
from fedblend.tracking.base import loggable, scalar_row


def wandb_module():
    """The ``wandb`` package (a ConfigError naming the extra to install when it is missing)."""
    return require("wandb", "wandb", "[log] wandb = true")


class WandbLog:
    """Logs metrics rows to a W&B run, offline by default (files under ``out/wandb``), with the resolved config."""

    def __init__(self, out: str | Path, identity: dict | None = None, project: str = "fedblend",
                 mode: str = "offline", fresh: bool = False):
        wandb = wandb_module()
        out = Path(out)
        target = out / "wandb"
        if fresh:  # an export replaces the runs an earlier export (or the live log) wrote there
            shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True, exist_ok=True)
        cfg = (identity or {}).get("config") or {}
        name = f"{cfg.get('name') or cfg.get('method', 'run')}-seed{cfg.get('seed', 0)}"
        self.run = wandb.init(project=project, name=name, dir=str(out), mode=mode, config=cfg, reinit="create_new",
                              tags=[str(cfg.get("method", ""))] if cfg.get("method") else None,
                              settings=wandb.Settings(console="off", silent=True, x_disable_stats=True))

    def __call__(self, m: dict) -> None:
        if loggable(m):
            self.run.log(scalar_row(m), step=int(m["round"]))

    def close(self) -> None:
        self.run.finish()
        wandb_module().teardown()  # finish() returns before W&B's service has written the run's files; this waits


def read_wandb_offline(run_dir: str | Path) -> dict[str, dict[int, float]]:
    """``{metric: {step: value}}`` of the offline W&B runs under ``run_dir`` (a results directory, or its
    ``wandb`` folder): the history records of their ``.wandb`` files, decoded with W&B's own record schema
    (``wandb.proto.wandb_internal_pb2.Record``)."""
    from wandb.proto import wandb_internal_pb2

    out: dict[str, dict[int, float]] = {}
    for path in sorted(Path(run_dir).rglob("run-*.wandb")):
        for data in wandb_records(path.read_bytes()):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(data)
            if rec.WhichOneof("record_type") != "history":
                continue
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item}
            step = int(items.get("_step", rec.history.step.num))
            for k, v in items.items():
                if not k.startswith("_") and isinstance(v, (int, float)):
                    out.setdefault(k, {})[step] = float(v)
    return out


WANDB_HEADER = b":W&B\xe1\xbe\x00"  # ident, magic 0xBEE1, version 0
WANDB_BLOCK = 32768


def wandb_records(blob: bytes) -> list[bytes]:
    """The records of a ``.wandb`` file: W&B's transaction log (LevelDB's log framing: 32 KiB blocks of records,
    each a 7-byte header -- crc32, length, type full / first / middle / last -- and its data)."""
    import struct

    if not blob.startswith(WANDB_HEADER):
        raise ValueError("not a W&B transaction log (bad header)")
    records, pending, pos = [], b"", len(WANDB_HEADER)
    while pos + 7 <= len(blob):
        left = WANDB_BLOCK - pos % WANDB_BLOCK
        if left < 7:  # the block's tail is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", blob[pos:pos + 7])
        data = blob[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            pos += WANDB_BLOCK - pos % WANDB_BLOCK if pos % WANDB_BLOCK else 0
            continue
        if kind == 1:
            records.append(data)
        elif kind == 2:
            pending = data
        elif kind == 3:
            pending += data
        elif kind == 4:
            records.append(pending + data)
            pending = b""
    return records
