"""Every check of a run config, before any data is loaded or file written: each field's type, choices and range,
the method and its transforms' tables, the cross-field rules, and whether the model fits the dataset."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from fedblend.algorithms.registry import METHODS, TRANSFORMS, parse_method
from fedblend.common.options import ConfigError, check_value, from_table, to_table
from fedblend.common.plugins import PluginError
from fedblend.config.migration import migrate_eval
from fedblend.config.schema import SCALAR_CHOICES, SCALAR_RANGES, SCALARS, SPLIT_ONLY, TABLES, RunConfig
from fedblend.data.federated import PartitionSpec
from fedblend.data.sources import INPUTS, find_dataset
from fedblend.models.zoo import build_model, find_model
from fedblend.rundir import check_name


def config_from_dict(raw: dict[str, Any]) -> RunConfig:
    """Validate a raw dict (from TOML and ``--set``) into a :class:`RunConfig`."""
    raw, legacy = migrate_eval(dict(raw))
    if legacy:
        model = (raw.get("eval") or {}).get("model")
        warnings.warn(f"{', '.join(legacy)}: the evaluated model is [eval] model now (the method's options no longer "
                      f"choose it); read as {f'eval.model = {model!r}' if model else 'the default'}. Write "
                      f"{f'[eval] model = {model!r}' if model else 'nothing (the default)'} instead", FutureWarning,
                      stacklevel=2)
    kwargs = _scalars(raw)
    method = kwargs.get("method", "fedavg")
    try:
        base, parts = parse_method(method)
    except PluginError:
        raise
    except ValueError as exc:
        raise ConfigError(f"method: {exc}") from exc
    given = _tables(raw, kwargs, base, parts)
    if "name" in kwargs:
        check_name(kwargs["name"])
    if kwargs.get("init") and not Path(kwargs["init"]).is_file():
        raise ConfigError(f"init: {kwargs['init']} is not a file (a state_dict saved with torch.save; a path "
                          f"relative to the working directory)")
    cfg = RunConfig(**kwargs)
    try:
        cfg.build_method()  # composition rules (e.g. a transform that needs a global model)
    except ValueError as exc:
        raise ConfigError(f"method: {exc}") from exc
    check_cross_fields(cfg, given["partition"])
    return cfg


def _scalars(raw: dict[str, Any]) -> dict[str, Any]:
    """The top-level fields of ``raw`` (taken out of it), each checked for its type, choices and range."""
    kwargs: dict[str, Any] = {}
    for k, tp in SCALARS.items():
        if k in raw:
            choices = SCALAR_CHOICES.get(k)
            if k in ("dataset", "model"):  # listed sorted in the message
                choices = tuple(sorted(choices))
                if isinstance(raw[k], str) and raw[k] not in choices and _plugin_exists(k, raw[k]):
                    choices = None  # a plug-in's dataset or model (fedblend.common.plugins)
            try:
                kwargs[k] = check_value(raw.pop(k), tp, k, choices, SCALAR_RANGES.get(k))
            except ConfigError as exc:
                if k not in ("dataset", "model"):
                    raise
                raise ConfigError(f"{exc} (or a plug-in: an entry point of group fedblend.{k}s, or "
                                  f"'package.module:{'function' if k == 'dataset' else 'Class'}')") from None
    return kwargs


def _tables(raw: dict[str, Any], kwargs: dict[str, Any], base: str, parts: list[str]) -> dict[str, set[str]]:
    """The tables of ``raw`` (taken out of it) checked into ``kwargs``: the config's, the method's ``options`` and
    each transform's; anything left in ``raw`` is an unknown field. The fields each config table set."""
    for name in [*TABLES, "options", *parts]:
        if name in raw and not isinstance(raw[name], dict):
            raise ConfigError(f"{name} must be a table (e.g. [{name}] in the file, or --set {name}.FIELD=VALUE), "
                              f"got {raw[name]!r}")
    given = {name: set(raw.get(name, {})) for name in TABLES}
    for name, cls in TABLES.items():
        kwargs[name] = from_table(cls, raw.pop(name, {}), name)
    kwargs["options"] = raw.pop("options", {})
    from_table(METHODS[base].options_cls, kwargs["options"], "options")
    kwargs["transforms"] = {}
    for p in parts:
        kwargs["transforms"][p] = raw.pop(p, {})
        from_table(TRANSFORMS[p].options_cls, kwargs["transforms"][p], p)
    if raw:
        key = sorted(raw)[0]
        allowed = sorted(list(SCALARS) + list(TABLES) + ["options"] + parts)
        hint = f" (a table for transform {key!r} needs it in method, e.g. 'fedavg+{key}')" if key in TRANSFORMS else ""
        raise ConfigError(f"unknown field {key!r}{hint}; allowed: {', '.join(allowed)}")
    return given


def check_config(cfg: RunConfig) -> RunConfig:
    """Check ``cfg`` as :func:`load_config` checks a file (types, choices, ranges, cross-field rules), whatever
    happened to it since (fields set through the Python API, tables replaced by hand-built dataclasses);
    returns the validated copy. ``run_experiment``, ``dry_run`` and ``bench`` call it."""
    if not isinstance(cfg, RunConfig):
        raise ConfigError(f"expected a RunConfig, got {type(cfg).__name__}")
    raw: dict[str, Any] = {k: getattr(cfg, k) for k in SCALARS}
    for name, cls in TABLES.items():
        table = getattr(cfg, name)
        if not isinstance(table, cls):
            raise ConfigError(f"{name} must be a {cls.__name__}, got {type(table).__name__}")
        raw[name] = to_table(table)
    if not isinstance(cfg.transforms, dict):
        raise ConfigError(f"transforms must be a dict of tables, got {cfg.transforms!r}")
    for name, table in (("options", cfg.options), *cfg.transforms.items()):
        if not isinstance(table, dict):
            raise ConfigError(f"{name} must be a table (a dict), got {table!r}")
        raw[name] = dict(table)
    return config_from_dict(raw)


def _plugin_exists(kind: str, name: str) -> bool:
    """Whether a plug-in provides dataset / model ``name`` (importing it; a broken plug-in raises its error)."""
    return (find_dataset if kind == "dataset" else find_model)(name) is not None


def check_cross_fields(cfg: RunConfig, partition_given: set[str] = frozenset()) -> None:
    """Rules between fields: the model fits the dataset, evaluation on validation data needs a split that has
    it, and split-specific ``[partition]`` options (``partition_given``: the ones set explicitly) match the
    split."""
    split = cfg.partition.split
    if "val" in (cfg.eval.split, cfg.eval.select) and split != "train_val_test":
        which = "eval.split" if cfg.eval.split == "val" else "eval.select"
        raise ConfigError(f"{which} = 'val' needs validation data, which only partition.split = "
                          f"'train_val_test' has; got partition.split = {split!r}")
    default = PartitionSpec()
    for name in sorted(partition_given & set(SPLIT_ONLY)):
        # the default value is accepted anywhere, so a resolved config.toml (every field written) loads again
        if split not in SPLIT_ONLY[name] and getattr(cfg.partition, name) != getattr(default, name):
            raise ConfigError(f"partition.{name} applies only to partition.split = "
                              f"{' or '.join(repr(s) for s in SPLIT_ONLY[name])}; got partition.split = {split!r}")
    if cfg.device == "cuda" and cfg.backend in ("processes", "flower-sim"):
        raise ConfigError(f"backend = {cfg.backend!r} runs on CPU only; got device = 'cuda' (use backend = "
                          "'sequential' or device = 'cpu')")


def check_model_fits(model: str, dataset: str) -> None:
    """The model accepts the dataset's samples (text vs image, image size), from :data:`INPUTS` alone: a
    model built for the dataset's shape runs one zero sample. Checked before a run (not by ``partition``,
    which builds no model)."""
    if dataset not in INPUTS:  # a plug-in dataset that does not declare its inputs: checked when it is loaded
        return
    kind, shape = INPUTS[dataset]
    wants = "text" if model == "fasttext" else "image"
    builtin = model in SCALAR_CHOICES["model"]  # a plug-in model says nothing about its input kind
    if kind != wants and builtin:
        raise ConfigError(f"model {model!r} needs {wants} data; dataset {dataset!r} is {kind} "
                          f"(choose {'fasttext' if kind == 'text' else 'an image model'})")
    if shape is None:
        return
    import torch

    c, side = shape
    info = {"in_channels": c, "image_size": side, "num_classes": 2, "input_shape": (c, side, side)}
    try:
        with torch.no_grad():
            build_model(model, info)(torch.zeros(1, c, side, side))
    except PluginError:
        raise
    except (RuntimeError, ValueError, TypeError, KeyError) as exc:
        raise ConfigError(f"model {model!r} does not fit dataset {dataset!r} ({c}x{side}x{side} images): "
                          f"{str(exc).splitlines()[0]}") from exc
