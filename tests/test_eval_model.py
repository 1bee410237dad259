"""``[eval] model``: which model of each client the personalized accuracy evaluates, one protocol field with a
per-method choice (``Method.eval_choices``) in place of the per-method options it replaced; configs that still
use those options (every committed run's ``config.toml``) load, resolve and resume as the same config."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import tomllib
import torch

from fedblend.common.errors import ConfigError
from fedblend.common.jsonio import dotted_keys
from fedblend.config import RUNTIME_ONLY, config_from_dict, config_hash, load_config, migrate_eval
from fedblend.experiment import check_resume

REPO = Path(__file__).resolve().parents[1]


def legacy_configs() -> list[Path]:
    """The committed runs' config.toml files that set one of the replaced options (but those started from an
    ``init`` file that is not committed, which load nowhere else either)."""
    lines = {p: p.read_text().splitlines() for p in (REPO / "results").rglob("config.toml")}
    return sorted(p for p, text in lines.items() if any(ln.startswith(("eval = ", "eval_global = ")) for ln in text)
                  and not any(ln.startswith("init = ") for ln in text))


def test_an_old_option_is_read_as_eval_model_with_a_warning():
    with pytest.warns(FutureWarning, match=r"options.eval = 'trained'.*\[eval\] model = 'trained'"):
        old = config_from_dict({"method": "fedphp", "options": {"eval": "trained", "mu": 0.5}})
    new = config_from_dict({"method": "fedphp", "options": {"mu": 0.5}, "eval": {"model": "trained"}})
    assert old.eval.model == "trained" and old.options == {"mu": 0.5}
    assert old.resolved() == new.resolved() and old.resolved()["eval"]["model"] == "trained"
    assert old.build_method().traits.eval_choice == "trained" and old.build_method().traits.keeps_model
    with pytest.warns(FutureWarning, match="ala.eval = 'stored'"):
        assert config_from_dict({"method": "fedprox+ala", "ala": {"eval": "stored"}}).eval.model == "stored"
    with pytest.warns(FutureWarning, match="options.eval_global"):
        assert config_from_dict({"method": "apfl", "options": {"eval_global": "trained"}}).eval.model == "trained"


def test_a_default_is_recorded_as_unset_so_the_config_and_its_hash_are_one():
    """An old option at its default chooses nothing; ``[eval] model`` set to the method's default resolves as
    unset: the three spellings are one config with one hash."""
    with pytest.warns(FutureWarning, match="the default"):
        old = config_from_dict({"method": "fedavg+ala", "ala": {"eval": "ala"}})
    explicit = config_from_dict({"method": "fedavg+ala", "eval": {"model": "ala"}})
    plain = config_from_dict({"method": "fedavg+ala"})
    assert old.eval.model is None and "model" not in plain.resolved()["eval"]
    assert old.resolved() == explicit.resolved() == plain.resolved()
    assert config_hash(explicit.resolved()) == config_hash(plain.resolved())


def test_a_choice_the_method_does_not_offer_or_two_choices_are_refused():
    with pytest.raises(ConfigError, match=r"eval.model = 'hpm' is not one of its choices: 'received'"):
        config_from_dict({"method": "fedavg", "eval": {"model": "hpm"}})
    with pytest.raises(ConfigError, match=r"options.eval = 'trained', ala.eval = 'stored'.*set it alone"):
        migrate_eval({"method": "dbe+ala", "options": {"eval": "trained"}, "ala": {"eval": "stored"}})
    with pytest.raises(ConfigError, match=r"options.eval = 'trained' and eval.model = 'hpm'"):
        migrate_eval({"method": "fedphp", "options": {"eval": "trained"}, "eval": {"model": "hpm"}})
    with pytest.raises(ConfigError, match="unknown field options.eval"):  # not a replaced option of this method
        config_from_dict({"method": "fedavg", "options": {"eval": "received"}})


def test_committed_runs_with_the_old_options_load_as_the_same_config_and_resume():
    """Every committed run's config.toml that sets a replaced option loads (with the warning), every field it
    recorded resolves to the same value once the option is moved to ``[eval] model``, and ``--resume`` of a
    checkpoint that recorded it (the old resolved config and its hash) finds no difference."""
    paths = legacy_configs()
    assert len(paths) >= 90
    for path in paths:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            cfg = load_config(path)
        assert any(issubclass(w.category, FutureWarning) for w in seen), path
        old = tomllib.loads(path.read_text())
        was, now = dotted_keys(migrate_eval(old)[0]), dotted_keys(cfg.resolved())
        assert not any(k.split(".")[0] in ("options", "ala") and k.endswith((".eval", ".eval_global")) for k in now)
        assert {k: (v, now.get(k)) for k, v in was.items()
                if k.split(".")[0] not in RUNTIME_ONLY and now.get(k) != v} == {}, path
        ck = {"extra": {"identity": {"config": old, "config_hash": config_hash(old),
                                     "threads": torch.get_num_threads()}}}
        check_resume(ck, cfg, path.parent / "checkpoint.pt")


def test_an_option_added_after_a_run_was_made_reads_at_its_default_for_resume_and_report_rows():
    """A run recorded before an option existed (its config lacks the field) is the run the option's default gives:
    it resumes, and shares a report row, with one that records the default; a non-default value still differs."""
    import copy

    from fedblend.config import config_diff, load_config, with_new_defaults
    from fedblend.results.runs import group_key

    now = load_config(None, ["method=fedgh"]).resolved()
    before = copy.deepcopy(now)
    del before["options"]["header_start"]
    assert config_diff(before, now) and not config_diff(with_new_defaults(before), now)
    other = load_config(None, ["method=fedgh", "options.header_start=client0"]).resolved()
    assert config_diff(with_new_defaults(before), other) == ["options.header_start: 'server' -> 'client0'"]
    row = {"method": "fedgh", "run": {"config": now}}
    assert group_key({"method": "fedgh", "run": {"config": before}}) == group_key(row)
    assert group_key({"method": "fedgh", "run": {"config": other}}) != group_key(row)
    plugin = {**before, "method": "pkg.mod:Mine"}  # not registered here: left as recorded
    assert with_new_defaults(plugin) == plugin
