"""Run configuration: a TOML file (or flags) validated up front into typed dataclasses.

Layout (every table optional; defaults shown in ``docs/config.md``)::

    method = "fedavg"          # a registered method, optionally with transforms: "fedprox+ala"
    dataset = "fmnist"         # mnist, fmnist, cifar10, cifar100, ag_news, usps, synthetic
    model = "lenet5"           # cnn4, lenet5, cnn5, mlp, fasttext
    rounds = 50
    seed = 0
    checkpoint_every = 10      # rounds between checkpoints (0 = never)
    device = "cpu"             # "cpu", "cuda" or "auto" (cuda when available)
    backend = "sequential"     # how client halves run: "sequential", "processes" (worker processes), "vmap" or
                               # "flower-sim" (Flower's Simulation Engine, Ray actors; `fedblend run` only)
    workers = 2                # worker processes of the "processes" backend, Ray actors of "flower-sim"
    on_nonfinite = "stop"      # a client update with NaN/inf: "stop" the run, or "skip" that client's update
    on_divergence = "stop"     # a diverged run (NaN/inf in a state or loss, a loss explosion): "stop" or "warn"
    divergence_factor = 100.0  # a train loss above this x max(ln classes, round 1's train loss) has diverged
    store = "memory"           # client states in "memory", or on "disk" (OUT/clients, one file per client)
    [partition] ...            # fedblend.data.federated.PartitionSpec
    [train] ...                # fedblend.core.training.TrainConfig
    [sampling] ...             # fedblend.core.sampling.SamplingConfig
    [eval] ...                 # fedblend.core.evaluation.EvalProtocol
    [options] ...              # the method's options (e.g. mu for fedprox)
    [ala] ...                  # a transform's options, one table per transform named in ``method``
    [log] ...                  # LogConfig: trackers and the end-of-run plot (runtime only: not in the hash)

``--set key=value`` overrides any field (``--set rounds=5 --set partition.alpha=0.5``); values are parsed as
TOML (numbers, booleans, quoted strings) and fall back to plain strings.

Every field is checked here, before any data is loaded or file written: its type, its choices, its range
(``RANGES`` of each table's dataclass, ``SCALAR_RANGES`` here) and the cross-field rules of
:func:`check_cross_fields`. :meth:`RunConfig.resolved` is the config with every default filled in (method and
transform tables included); :func:`config_hash` identifies it, and :func:`config_diff` lists what differs
between two resolved configs (``--resume`` refuses a differing one).

The package: :mod:`~fedblend.config.schema` (the fields, their choices and ranges, :class:`RunConfig`),
:mod:`~fedblend.config.loading` (TOML and ``--set`` in, the resolved config out as TOML),
:mod:`~fedblend.config.validation` (every check), :mod:`~fedblend.config.migration` (configs of earlier versions),
:mod:`~fedblend.config.identity` (hash and differences), :mod:`~fedblend.config.docs` (the tables of
``docs/config.md``).
"""


from fedblend.common.options import ConfigError
from fedblend.config.docs import field_docs
from fedblend.config.identity import config_diff, config_hash
from fedblend.config.loading import apply_overrides, dump_toml, load_config, parse_value, toml_value
from fedblend.config.migration import migrate_eval, with_new_defaults
from fedblend.config.schema import (
    BACKEND_NAMES,
    DEVICES,
    DIVERGENCE_POLICIES,
    LEGACY_EVAL,
    NONFINITE_POLICIES,
    RUNTIME_ONLY,
    SCALAR_CHOICES,
    SCALAR_RANGES,
    SCALARS,
    SPLIT_ONLY,
    STORES,
    TABLES,
    LogConfig,
    RunConfig,
    fields_of,
)
from fedblend.config.validation import check_config, check_cross_fields, check_model_fits, config_from_dict

__all__ = ["BACKEND_NAMES", "DEVICES", "DIVERGENCE_POLICIES", "LEGACY_EVAL", "NONFINITE_POLICIES", "RUNTIME_ONLY",
           "SCALARS", "SCALAR_CHOICES", "SCALAR_RANGES", "SPLIT_ONLY", "STORES", "TABLES", "ConfigError", "LogConfig",
           "RunConfig", "apply_overrides", "check_config", "check_cross_fields", "check_model_fits", "config_diff",
           "config_from_dict", "config_hash", "dump_toml", "field_docs", "fields_of", "load_config", "migrate_eval",
           "parse_value", "toml_value", "with_new_defaults"]
