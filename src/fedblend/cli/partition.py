"""``fedblend partition CONFIG.toml [--set ...] [--out DIR] [--export pflib DIR]``: build and show a run's partition
without training (the class-count table; with ``--out`` also ``partition.json``, ``partition.txt`` and a PNG)."""

from __future__ import annotations

import argparse
import os
import shutil
import warnings
from pathlib import Path

from fedblend.cli import args as cli_args
from fedblend.common.errors import ConfigError, RunExistsError
from fedblend.common.optional import MissingPackageError
from fedblend.rundir import DirLock


def add_parser(sub) -> None:
    part = sub.add_parser("partition", help="build and show a partition without training")
    cli_args.common(part)
    part.add_argument("--export", nargs=2, metavar=("FORMAT", "DIR"), help="write the partition in a peer's format: "
                      "pflib (train/{k}.npz, test/{k}.npz, config.json) into an empty folder or over an earlier "
                      "PFLlib export (replaced whole)")
    part.add_argument("--force", action="store_true", help="--out may be a run directory: the run there is "
                      "removed first (its partition would no longer match its checkpoint)")


def command(args: argparse.Namespace) -> int:
    from fedblend.experiment import build_data

    cfg = cli_args.run_config(args)
    fed = build_data(cfg, args.data_dir)
    print(fed.table())
    if args.out:
        _write(fed, Path(args.out), args.force)
    if args.export:
        _export_partition(cfg, fed, args)
    return 0


def _write(fed, out: Path, force: bool) -> None:
    """``--out``: ``partition.json``, ``partition.txt`` and (with matplotlib) ``partition.png``."""
    from fedblend.results.partition import plot_counts

    with DirLock(out, "partition folder"):
        _refuse_run_in(out, force)
        fed.save(out / "partition.json")
        (out / "partition.txt").write_text(fed.table() + "\n")
        try:
            plot_counts(fed, out / "partition.png")
            png = ", partition.png"
        except MissingPackageError as exc:  # the partition is written; its picture is what is missing
            warnings.warn(f"no partition.png: {exc}", RuntimeWarning, stacklevel=1)
            png = ""
    print(f"wrote {out}/partition.json, partition.txt{png}")


def _refuse_run_in(out: Path, force: bool) -> None:
    """``partition --out``: a directory holding a run (more than an earlier partition's files) is refused, or with
    ``force`` cleared: the run's checkpoint would otherwise continue on a partition it was not trained on."""
    from fedblend.rundir import clear_run, holds_run

    run_files = [f for f in holds_run(out) if f not in ("partition.json", "partition.txt")]
    if run_files and not force:
        raise RunExistsError(f"{out} holds a run ({', '.join(run_files)}); a new partition.json would not match its "
                             f"checkpoint and config: use another --out, or --force to delete that run first")
    if run_files:
        clear_run(out)


def _export_partition(cfg, fed, args: argparse.Namespace) -> None:
    from fedblend.data.interop import export_pflib
    from fedblend.data.sources import load_dataset

    fmt, target = args.export
    if fmt != "pflib":
        raise ConfigError(f"--export: unknown format {fmt!r}; known: pflib")
    raw = load_dataset(cfg.dataset, args.data_dir)
    meta = {"partition": cfg.partition.kind, "alpha": cfg.partition.alpha, "batch_size": cfg.train.batch_size,
            "balance": cfg.partition.balanced, "fedblend_split": cfg.partition.split, "fedblend_seed": cfg.seed}
    if "val" in fed.indices:  # refused by export_pflib too; here before the folder is touched
        from fedblend.data.partition import PartitionError

        raise PartitionError("PFLlib's layout has train and test only; export a partition without validation "
                             "data (partition.split = 'merge' or 'official')")
    with DirLock(target, "export folder"):
        _clear_pflib_export(Path(target))
        export_pflib(raw, fed.indices, cfg.partition.split, target, meta)
    print(f"wrote {target}/train/*.npz, test/*.npz, config.json (PFLlib layout, {fed.num_clients} clients)")


def _clear_pflib_export(target: Path) -> None:
    """``--export pflib DIR`` writes into an empty folder or over an earlier PFLlib export, which is removed
    whole first (``train/``, ``test/``, ``config.json``: no client of a larger earlier export is left behind to
    be read back); a folder holding anything else is refused."""
    from fedblend.rundir import LOCK_NAME

    entries = sorted(e for e in os.listdir(target) if e != LOCK_NAME)
    layout = {"train", "test", "config.json"}
    earlier = bool(entries) and set(entries) <= layout and all(
        (target / d).is_dir() and not (target / d).is_symlink()
        and all(f.endswith(".npz") and (target / d / f).is_file() for f in os.listdir(target / d))
        for d in ("train", "test") if d in entries) and not (target / "config.json").is_dir()
    if entries and not earlier:
        shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
        raise ConfigError(f"--export pflib {target}: the folder holds files that are not a PFLlib export ({shown}); "
                          f"export into an empty or new folder")
    for e in entries:
        p = target / e
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink()
