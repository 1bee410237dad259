"""``bookkeeping/golden.py``: telling a float-only difference (another CPU's kernels, amplified by training) from a
difference in what ran (sampled clients, byte counts, fields). The checks themselves run real data (too slow
for the default suite)."""

import pytest

from tests.helpers import load_script

ROW = {"round": 1, "selected": [0, 2], "bytes_up": [10, 10], "train_loss": 0.22251369330081067, "acc": 0.3972}


@pytest.fixture(scope="module")
def golden():
    return load_script("golden", "bookkeeping")


def test_a_float_only_difference_beyond_the_tolerance_is_named(golden):
    got = {**ROW, "train_loss": 0.2230392662973443}  # what an AVX2 machine gave for t3-mnist-pat-fedavg
    assert golden.compare([ROW], [got])  # beyond the cross-machine tolerance
    assert golden.only_floats_differ([ROW], [got])


@pytest.mark.parametrize("change", [{"selected": [0, 3]}, {"bytes_up": [10, 11]}, {"extra_loss": 1.0},
                                    {"train_loss": float("nan")}])
def test_a_difference_in_what_ran_is_not_float_only(golden, change):
    got = {**ROW, "acc": 0.5, **change}
    assert not golden.only_floats_differ([ROW], [got])


def test_equal_histories_have_no_float_only_difference(golden):
    assert not golden.only_floats_differ([ROW], [dict(ROW)])
    assert not golden.only_floats_differ([ROW], [ROW, {**ROW, "round": 2}])  # another round count


def test_record_and_check_both_apply_the_extra_set_and_args(golden, tmp_path, monkeypatch):
    """A variant recorded with ``--set`` is recorded as that variant (record once ignored ``--set``)."""
    calls = []

    def fake_run_case(config, overrides, extra_args):
        calls.append((list(overrides), list(extra_args)))
        return [dict(ROW)]

    monkeypatch.setattr(golden, "run_case", fake_run_case)
    cfg = tmp_path / "case.toml"
    cfg.write_text('method = "fedavg"\n')
    for mode in ("record", "check"):
        assert golden.main([mode, str(cfg), "--golden", str(tmp_path / "g"), "--set", "options.x=1",
                            "--args", "--threads 1"]) == 0
    assert calls == [(["options.x=1"], ["--threads", "1"])] * 2
    assert (tmp_path / "g" / "case.jsonl").read_text().strip()
