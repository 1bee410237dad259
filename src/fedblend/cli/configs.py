"""``fedblend configs [FILTER]``: the bundled configs, each with a one-line description made from its fields."""

from __future__ import annotations

import argparse
from pathlib import Path

from fedblend.cli import args as cli_args
from fedblend.cli.exits import one_line
from fedblend.common.errors import FedblendError


def add_parser(sub) -> None:
    cfgs = sub.add_parser("configs", help="list the bundled configs with their one-line descriptions")
    cfgs.add_argument("filter", nargs="?", help="only configs whose path contains this")
    cli_args.debug(cfgs)


def command(args: argparse.Namespace) -> int:
    print(configs_text(args.filter), end="")
    return 0


def configs_root() -> Path:
    """The bundled ``configs/`` folder (the repository's, beside ``src/``), else ``./configs``."""
    here = Path(__file__).resolve().parents[3] / "configs"
    return here if here.is_dir() else Path("configs")


def configs_text(pattern: str | None) -> str:
    root = configs_root()
    paths = sorted(root.rglob("*.toml"))
    if pattern:
        paths = [p for p in paths if pattern in str(p.relative_to(root))]
    if not paths:
        return f"no configs under {root}" + (f" matching {pattern!r}" if pattern else "") + "\n"
    rows = [(str(p.relative_to(root.parent)), config_description(p)) for p in paths]
    width = max(len(r[0]) for r in rows)
    return "".join(f"{path:{width}s}  {desc}\n" for path, desc in rows)


def config_description(path: Path) -> str:
    """What a config runs, from its fields: ``FedAPA (mu=0.3): FMNIST, Dir(0.1), 20 clients, LeNet-5; 50 rounds``
    (the method with the options that differ from its defaults, the setting, the rounds)."""
    from fedblend.config import RunConfig, load_config
    from fedblend.results.names import method_name, setting_text

    try:
        cfg = load_config(path)
    except FedblendError as exc:
        return f"(does not load: {one_line(exc)})"
    resolved = cfg.resolved()
    defaults = RunConfig(method=cfg.method).resolved()  # the method's and transforms' default options
    changed = {k: v for k, v in resolved["options"].items() if defaults["options"].get(k) != v}
    for t in cfg.transforms:
        changed.update({f"{t}.{k}": v for k, v in resolved[t].items() if defaults[t].get(k) != v})
    opts = ", ".join(f"{k}={v}" for k, v in list(changed.items())[:3]) + (", ..." if len(changed) > 3 else "")
    return (f"{method_name(cfg.method)}{f' ({opts})' if opts else ''}: {setting_text(resolved)}; "
            f"{cfg.rounds} rounds")
