"""The checks before a run continues from its checkpoint (``--resume``): the same config (only ``rounds`` may
grow, the runtime-only fields may differ) and the same ``partition.json`` it was written with."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from fedblend.common import files
from fedblend.common.errors import CheckpointMismatchError, ResumeMismatchError
from fedblend.config import RUNTIME_ONLY, RunConfig, config_diff, config_hash, migrate_eval, with_new_defaults


def check_resume(ck: dict, cfg: RunConfig, ck_path: Path) -> None:
    """Refuse to continue a checkpoint under a different config (listing the differing fields); only
    ``rounds`` may grow, and the runtime-only fields may differ. Warns when the thread count differs (results
    are bit-identical only at the same per-process thread count)."""
    old = (ck.get("extra") or {}).get("identity")
    if not old:
        raise ResumeMismatchError(f"{ck_path} records no config (written by an older fedblend), so --resume "
                                  f"cannot check it continues the same run; start again with --force")
    if "config_hash" in old and config_hash(old["config"]) != old["config_hash"]:
        raise CheckpointMismatchError(f"--resume: {ck_path} records config hash {old['config_hash']} but its config "
                                      f"hashes to {config_hash(old['config'])} (the checkpoint was altered); start "
                                      f"again with --force")
    new = cfg.resolved()
    # a run started before [eval] model (its evaluation options moved there) or before an option existed (at its
    # default, the behaviour the run had)
    was = with_new_defaults(migrate_eval(old["config"])[0])
    diffs = config_diff(was, new, ignore=RUNTIME_ONLY + ("rounds",))
    if new["rounds"] < old["config"]["rounds"]:
        diffs.append(f"rounds: {old['config']['rounds']!r} -> {new['rounds']!r} (a resumed run can only be "
                     f"extended)")
    if diffs:
        raise ResumeMismatchError(f"--resume: the config differs from the one {ck_path.parent} was run with: "
                                  f"{'; '.join(diffs)}. Resume with {ck_path.parent / 'config.toml'} (plus a "
                                  f"larger rounds), or start a new run (another --out, or --force)")
    if old.get("threads") != torch.get_num_threads():
        warnings.warn(f"resuming with {torch.get_num_threads()} threads, the run used {old.get('threads')}: "
                      f"results may differ from an uninterrupted run in the last bits (use --threads "
                      f"{old.get('threads')})", RuntimeWarning, stacklevel=3)


def check_checkpoint_files(ck: dict, out: Path, ck_path: Path) -> None:
    """Refuse to resume when ``partition.json`` is not the file the checkpoint was written with (missing or
    changed: its sha256 is recorded in the checkpoint). The client snapshot is checked when it is restored
    (:func:`fedblend.core.state.verify_snapshot`)."""
    want = ((ck.get("extra") or {}).get("files") or {}).get("partition.json")
    if want is None:  # an older fedblend recorded no hashes
        return
    part = out / "partition.json"
    if not part.is_file():
        raise CheckpointMismatchError(f"--resume: {part} is missing; {ck_path} was written with it (the clients' "
                                      f"data): restore it, or start again with --force")
    if files.sha256_file(part) != want:
        raise CheckpointMismatchError(f"--resume: {part} changed since {ck_path} was written (sha256 differs), so "
                                      f"the clients' data would not be the run's: restore it, or start again with "
                                      f"--force")
