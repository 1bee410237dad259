"""bookkeeping/validation2.py: the second validation setting's verdict rule (docs/validation-2.md), on curves made
by hand so that each clause decides."""

from __future__ import annotations

import json
import math

import pytest

from tests.helpers import load_script


def _curve(level: float, slope: float = 0.0) -> dict[int, float]:
    return {r: level + slope * r for r in range(1, 21)}


@pytest.fixture(scope="module")
def v2():
    return load_script("validation2", "bookkeeping")


def test_curve_agreement_counts_rounds_inside_two_standard_errors_plus_the_floor(v2):
    ours = [_curve(80.0), _curve(82.0), _curve(84.0)]  # mean 82, sd 2 at every round
    theirs = [_curve(83.0), _curve(83.0), _curve(83.0)]  # mean 83, sd 0
    c = v2.curve_agreement(ours, theirs)
    se = math.sqrt(4 / 3)
    assert 1.0 <= 2 * se + v2.FLOOR and c.inside == 11 and c.agrees and c.d_last == pytest.approx(-1.0)
    far = [_curve(90.0)] * 3  # identical seeds: only the floor counts, 8 points is outside at every round
    assert v2.curve_agreement(far, theirs).inside == 0 and not v2.curve_agreement(far, theirs).agrees
    # a gap that opens late: inside at rounds 10-17 (8), outside at 18-20 -> fewer than 9 -> differs
    late = [{**_curve(83.0), 18: 90.0, 19: 90.0, 20: 90.0}] * 3
    assert v2.curve_agreement(late, theirs).inside == 8 and not v2.curve_agreement(late, theirs).agrees


def test_same_ordering_needs_the_same_sign_unless_one_side_is_a_tie(v2):
    up, down, tied = [_curve(90.0)], [_curve(80.0)], [_curve(85.5)]
    anchor = [_curve(85.0)]
    assert v2.same_ordering(up, anchor, up, anchor)[2]
    assert not v2.same_ordering(up, anchor, down, anchor)[2]  # +5 here, -5 there
    ours, theirs, holds = v2.same_ordering(up, anchor, tied, anchor)
    assert (ours, theirs, holds) == (pytest.approx(5.0), pytest.approx(0.5), True)  # within 1 point there: a tie


def test_paired_interval_is_the_t_interval_of_the_per_seed_differences(v2):
    method = {0: _curve(86.0), 1: _curve(88.0), 2: _curve(87.0), 5: _curve(99.0)}
    anchor = {0: _curve(85.0), 1: _curve(85.0), 2: _curve(85.0)}  # seed 5 has no partner: left out
    mean, low, high, n = v2.paired(method, anchor)
    assert (n, mean) == (3, pytest.approx(2.0))
    half = 4.302652729911275 * 1.0 / math.sqrt(3)  # t(0.975, 2 df) x sd 1 / sqrt(3)
    assert (low, high) == (pytest.approx(2.0 - half), pytest.approx(2.0 + half))
    assert math.isnan(v2.paired({0: _curve(86.0)}, anchor)[1])
    with pytest.raises(ValueError, match="round"):
        v2.final({r: 80.0 for r in range(1, 19)})


def test_verdict_rows_read_both_sides_from_results_folders(v2, tmp_path):
    def side(folder, levels, ref_levels):
        for seed, level in enumerate(levels):
            run = folder / "fedblend" / f"seed{seed}"
            run.mkdir(parents=True)
            (run / "summary.json").write_text(json.dumps({"status": "finished"}))
            (run / "metrics.jsonl").write_text("".join(json.dumps({"round": r, "acc": (level + 0.0) / 100}) + "\n"
                                                       for r in range(1, 21)))
        (folder / "reference.json").write_text(json.dumps({"runs": [[x / 100] * 20 for x in ref_levels]}))

    side(tmp_path / "local", [80, 81, 82], [80, 81, 82])
    side(tmp_path / "fedavg", [84, 85, 86], [84, 85, 86])
    side(tmp_path / "fedgh", [88, 89, 90], [88, 89, 90])
    side(tmp_path / "apple", [79, 80, 81], [88, 89, 90])  # a port that fell to Local's level
    rows = {r.split("|")[1].strip(): r for r in v2.verdict_rows(tmp_path)}
    assert "**agrees**" in rows["fedgh"] and "11 of 11" in rows["fedgh"]
    assert "**differs**" in rows["apple"] and "0 of 11" in rows["apple"]


def test_final_is_the_mean_of_the_last_three_rounds_of_the_budget(v2):
    curve = {r: float(r) for r in range(1, 51)}
    assert v2.final(curve) == 19.0 and v2.final(curve, last=50) == 49.0
    with pytest.raises(ValueError, match=r"\[48, 49, 50\]"):
        v2.final({r: 1.0 for r in range(1, 49)}, last=50)


def test_window_is_the_second_half_of_the_budget_with_the_share_nine_of_eleven(v2):
    assert v2.window(20) == (v2.ROUNDS, v2.INSIDE)  # the rule as first stated
    assert v2.window(50) == (tuple(range(25, 51)), 22) and v2.window(100) == (tuple(range(50, 101)), 42)
    long_ours = [{r: 80.0 + (8.0 if r < 25 else 0.0) for r in range(1, 51)}] * 3  # apart only before round 25
    long_theirs = [{r: 80.0 for r in range(1, 51)}] * 3
    c = v2.curve_agreement(long_ours, long_theirs, budget=50)
    assert (c.inside, c.of, c.agrees) == (26, 26, True)
    late = [{**long_theirs[0], **{r: 88.0 for r in range(46, 51)}}] * 3  # 5 of 26 outside -> 21 < 22 -> differs
    assert (v2.curve_agreement(late, long_theirs, budget=50).inside, v2.curve_agreement(late, long_theirs, 50).agrees) \
        == (21, False)


def test_budget_of_refuses_runs_of_different_lengths(v2):
    assert v2.budget_of([_curve(80.0), _curve(81.0)]) == 20
    with pytest.raises(ValueError, match="different budgets"):
        v2.budget_of([_curve(80.0), {r: 80.0 for r in range(1, 51)}])


def _runs(folder, levels, rounds=50):
    for seed, level in enumerate(levels):
        run = folder / "fedblend" / f"seed{seed}"
        run.mkdir(parents=True)
        (run / "summary.json").write_text(json.dumps({"status": "finished"}))
        (run / "metrics.jsonl").write_text("".join(json.dumps({"round": r, "acc": level / 100}) + "\n"
                                                   for r in range(1, rounds + 1)))


def test_paired_rows_name_a_method_local_cannot_be_told_apart_from(v2, tmp_path):
    _runs(tmp_path / "local", [80, 81, 82])
    assert v2.paired_rows(tmp_path) == []  # FedAvg-FT has no runs yet: no table
    _runs(tmp_path / "fedavg-ft", [90, 90, 90])
    _runs(tmp_path / "fedrep", [88, 90, 89])  # +8, +9, +7 over Local
    _runs(tmp_path / "apple", [79, 82, 82])  # -1, +1, 0: fell to Local
    _runs(tmp_path / "ditto", [85])  # one seed so far
    rows = {r.split("|")[1].strip(): [c.strip() for c in r.split("|")[2:-1]] for r in v2.paired_rows(tmp_path)}
    assert set(rows) == {"apple", "ditto", "fedrep"}  # the anchors have no row of their own
    half = 4.302652729911275 * 1.0 / math.sqrt(3)
    assert rows["fedrep"][:2] == ["3", "89.00 ± 1.00"]
    assert rows["fedrep"][2] == f"+8.00 [{8 - half:+.2f}, {8 + half:+.2f}]" and rows["fedrep"][4] == "above Local"
    assert rows["fedrep"][3].startswith("-1.00 [")
    assert rows["apple"][4] == "**not told apart from Local**"
    assert rows["ditto"][2:] == ["+5.00", "-5.00", "1 seed: no interval"]
    assert v2.render_paired(tmp_path).count("\n") == 1 + 3


def test_tables_writes_both_second_setting_blocks_into_its_doc(tmp_path):
    tables = load_script("tables", "bookkeeping")
    doc = tmp_path / "docs" / "validation-2.md"
    doc.parent.mkdir()
    doc.write_text("x\n<!-- table:validation2-paired -->\nold\n<!-- /table:validation2-paired -->\n"
                   "<!-- table:validation2-verdicts -->\n<!-- /table:validation2-verdicts -->\n")
    _runs(tmp_path / "results" / "validation-2" / "local", [80, 81, 82])
    _runs(tmp_path / "results" / "validation-2" / "fedavg-ft", [90, 90, 90])
    _runs(tmp_path / "results" / "validation-2" / "fedrep", [88, 90, 89])
    new, changed = tables.regenerate(doc.read_text(), tmp_path)
    assert sorted(changed) == ["validation2-paired", "validation2-verdicts"]
    assert "| fedrep | 3 | 89.00 ± 1.00 | +8.00 [" in new and "| method | runs (fedblend / reference)" in new


def _first_setting(folder, levels, ref_runs, key="acc"):
    """A method folder in the first setting's layout: fedblend/ (seed 0), fedblend-seed1/, ...; reference.json
    with a single ``acc`` curve (as committed before repetitions) or ``runs``. The runs record ``levels`` under
    ``key`` (and ``acc`` 0 when ``key`` is another metric)."""
    for seed, level in enumerate(levels):
        run = folder / ("fedblend" if seed == 0 else f"fedblend-seed{seed}")
        run.mkdir(parents=True)
        (run / "summary.json").write_text(json.dumps({"status": "finished"}))
        (run / "metrics.jsonl").write_text("".join(json.dumps({"round": r, "acc": 0.0, key: level / 100}) + "\n"
                                                   for r in range(1, 21)))
    ref = {"acc": [ref_runs[0] / 100] * 20} if len(ref_runs) == 1 else {"runs": [[x / 100] * 20 for x in ref_runs]}
    if key != "acc":
        ref["fedblend_metric"] = key
    (folder / "reference.json").write_text(json.dumps(ref))


def test_first_setting_verdicts_read_its_layout_and_the_metric_the_reference_names(v2, tmp_path):
    first = tmp_path / "validation"
    _first_setting(first / "local", [80, 81, 82], [80, 81, 82])
    _first_setting(first / "fedavg", [84, 85, 86], [85])  # a reference still at one run: counted as one
    _first_setting(first / "pfedme", [88, 89, 90], [88, 89, 90], key="global_acc")  # its personalized acc is 0 here
    (first / "fedavg" / "fedblend-seed2" / "summary.json").write_text(json.dumps({"status": "diverged"}))
    (first / "partialfed").mkdir()
    (first / "partialfed" / "reference.json").write_text(json.dumps({"status": "no public reference"}))
    vs = v2.verdicts(first, v2.first_setting_curves)
    assert vs["fedavg"].runs == (3, 1) and vs["fedavg"].diverged == (1, 0)  # counted, and not a curve
    assert vs["fedavg"].runs_cell == "3 (1 diverged) / 1" and not any(vs["fedavg"].diverges)
    assert vs["pfedme"].agrees and vs["pfedme"].curve.inside == 11  # read from global_acc, not acc
    table = v2.render_both(first, tmp_path / "validation-2")  # no second setting yet
    rows = {r.split("|")[1].strip(): [c.strip() for c in r.split("|")[2:-1]] for r in table.splitlines()[2:]}
    assert set(rows) == {"fedavg", "local", "pfedme"}  # partialfed: nothing to run side by side
    assert rows["pfedme"] == ["3 / 3", "11 of 11", "**agrees**", "-", "-", "-"]
    second = tmp_path / "validation-2"
    for name, ours, theirs in (("local", 80, 80), ("fedavg", 90, 90), ("pfedme", 95, 85)):
        _runs(second / name, [ours, ours + 1, ours + 2])
        (second / name / "reference.json").write_text(json.dumps({"runs": [[(theirs + i) / 100] * 50 for i in range(3)]}))
    rows = {r.split("|")[1].strip(): [c.strip() for c in r.split("|")[2:-1]]
            for r in v2.render_both(first, second).splitlines()[2:]}
    assert rows["pfedme"][3:] == ["3 / 3", "0 of 26", "**differs**"] and rows["local"][5] == "**agrees**"


def test_collect_puts_each_settings_finished_runs_into_its_layout(v2, tmp_path):
    runs, results = tmp_path / "runs", tmp_path / "results"

    def run(path, status="finished"):
        path.mkdir(parents=True)
        (path / "summary.json").write_text(json.dumps({"status": status}))
        (path / "metrics.jsonl").write_text(json.dumps({"round": 1, "acc": 0.5}) + "\n")
        (path / "config.toml").write_text(f"# {path.name}\n")
        (path / "checkpoint.pt").write_bytes(b"x")  # not a result: never copied

    run(runs / "validation-2" / "fedrep" / "seed1")
    run(runs / "validation-2" / "fedrep" / "seed2", status="running")  # cut: not a result yet
    run(runs / "validation-2" / "apple" / "seed0", status="diverged")  # stopped by the divergence check: a result
    run(runs / "validation" / "ditto" / "seed0")
    run(runs / "validation" / "ditto" / "seed2")
    (results / "validation" / "ditto" / "fedblend").mkdir(parents=True)  # committed seed 0: kept
    copied, kept = v2.collect(runs, results)
    assert sorted(p.relative_to(results).as_posix() for p in copied) == [
        "validation-2/apple/fedblend/seed0", "validation-2/fedrep/fedblend/seed1", "validation/ditto/fedblend-seed2"]
    assert kept == [results / "validation" / "ditto" / "fedblend"]
    assert sorted(p.name for p in (results / "validation-2/fedrep/fedblend/seed1").iterdir()) == [
        "config.toml", "metrics.jsonl", "summary.json"]
    assert v2.first_setting_curves(results / "validation" / "ditto") == {2: {1: 50.0}}  # empty seed-0 folder: no run


def test_paired_rows_name_diverged_seeds_and_never_average_them(v2, tmp_path):
    _runs(tmp_path / "local", [80, 81, 82])
    _runs(tmp_path / "fedavg-ft", [90, 90, 90])
    _runs(tmp_path / "ditto", [88, 89])
    for folder, seed in ((tmp_path / "ditto", 2), (tmp_path / "apple", 0)):
        run = folder / "fedblend" / f"seed{seed}"
        run.mkdir(parents=True)
        (run / "summary.json").write_text(json.dumps({"status": "diverged", "divergence": {"round": 1}}))
        (run / "metrics.jsonl").write_text("")
    rows = {r.split("|")[1].strip(): [c.strip() for c in r.split("|")[2:-1]] for r in v2.paired_rows(tmp_path)}
    assert rows["apple"] == ["0", "-", "-", "-", "seed 0 diverged (round 1)"]
    assert rows["ditto"][:2] == ["2", "88.50 ± 0.71"]  # seeds 0-1 only
    assert rows["ditto"][4].endswith("; seed 2 diverged (round 1)")


def test_divergence_rule_decides_when_more_than_half_of_a_sides_runs_diverged(v2, tmp_path):
    """Rule 3: a side whose majority of runs diverged "diverges"; both: agrees, one: differs naming it; a
    minority of diverged runs is counted and left out of the curves (fedblend: status ``diverged``; reference:
    ``runs_nonfinite_loss``)."""
    def method(name, levels, diverged_seeds=(), ref_levels=(80, 81, 82), ref_bad=(False, False, False)):
        _runs(tmp_path / name, levels)
        for seed in diverged_seeds:
            (tmp_path / name / "fedblend" / f"seed{seed}" / "summary.json").write_text(
                json.dumps({"status": "diverged", "divergence": {"round": 1}}))
        (tmp_path / name / "reference.json").write_text(json.dumps(
            {"runs": [[x / 100] * 50 for x in ref_levels], "runs_nonfinite_loss": list(ref_bad)}))

    method("local", [80, 81, 82])
    method("fedavg", [90, 91, 92], ref_levels=(90, 91, 92))
    method("apple", [80, 81, 82], diverged_seeds=(0, 1), ref_bad=(True, True, False))
    method("ditto", [80, 81, 82], diverged_seeds=(0, 1, 2))
    method("fedgh", [80, 81, 82], ref_bad=(False, True, True))
    method("fedrep", [10, 81, 82], diverged_seeds=(0,), ref_levels=(10, 81.5, 81.5), ref_bad=(True, False, False))
    vs = v2.verdicts(tmp_path)
    assert vs["apple"].word == "agrees (both diverge)" and vs["apple"].agrees and vs["apple"].curve is None
    assert vs["ditto"].word == "differs (fedblend diverges)" and not vs["ditto"].agrees
    assert vs["fedgh"].word == "differs (the reference diverges)"
    # one run a side diverged: the other two decide, the 10 % runs never enter the mean
    assert vs["fedrep"].diverged == (1, 1) and vs["fedrep"].word == "agrees" and vs["fedrep"].curve.inside == 26
    assert vs["fedrep"].curve.d_last == pytest.approx(0.0)  # 81.5 a side; with the 10 % runs it would not be
    rows = {r.split("|")[1].strip(): [c.strip() for c in r.split("|")[2:-1]] for r in v2.verdict_rows(tmp_path)}
    assert rows["apple"] == ["3 (2 diverged) / 3 (2 diverged)", "-", "-", "-", "-", "**agrees (both diverge)**"]


def test_init_pairs_set_each_run_from_a_reference_initial_model_against_that_repetition(v2, tmp_path):
    """fedblend-pflib-init/ pairs with the reference's repetition 0 and fedblend-pflib-init-seed<S>/ with
    repetition S, but only when the reference seeded its repetitions by index (runs_seeding)."""
    def run(folder, level):
        folder.mkdir(parents=True)
        (folder / "summary.json").write_text(json.dumps({"status": "finished"}))
        (folder / "metrics.jsonl").write_text("".join(json.dumps({"round": r, "acc": (level + (r == 7)) / 100}) + "\n"
                                                      for r in range(1, 21)))

    m = tmp_path / "fedbabu"
    run(m / "fedblend-pflib-init", 50)
    run(m / "fedblend-pflib-init-seed2", 60)
    ref = {"runs": [[0.49] * 20, [0.30] * 20, [0.61] * 20]}
    (m / "reference.json").write_text(json.dumps(ref))
    assert list(v2.init_pairs(m)) == [0]  # unseeded repetitions: repetition 2 is not seed 2's draw
    (m / "reference.json").write_text(json.dumps({**ref, "runs_seeding": "by index"}))
    pairs = v2.init_pairs(m)
    assert list(pairs) == [0, 2] and pairs[2][1][20] == pytest.approx(61.0)
    row = v2.render_init_pairs(tmp_path).splitlines()[2]
    cells = [c.strip() for c in row.split("|")[1:-1]]
    assert cells == ["fedbabu", "0, 2", "+1.05; -0.95", "+2.00 (7); -1.00 (1)", "50.00 / 49.00; 60.00 / 61.00"]


def test_rounds_report_shows_each_run_and_marks_the_same_rounds_inside_as_the_rule(v2, tmp_path):
    folder = tmp_path / "validation" / "fedgh"
    _first_setting(folder, [80, 81, 82], [86, 86, 86])  # d = -5 everywhere, band 2 * sqrt(1/3) + 0.5 = 1.65
    report = v2.rounds_report(folder, v2.first_setting_curves)
    rows = report.splitlines()[2:]
    assert len(rows) == 20 and all("NO" in row for row in rows)
    assert rows[9].startswith("  10*") and not rows[8].startswith("   9*")  # the window is marked: rounds 10-20
    assert "80.00  81.00  82.00 |  86.00  86.00  86.00 |  -5.00 |  1.65 | NO" in rows[0]
    # agreeing curves: every window round reads "yes", as many as curve_agreement counts inside
    ours, theirs = v2.first_setting_curves(folder, "acc"), v2.reference_curves(folder / "reference.json")
    close = tmp_path / "validation" / "fedper"
    _first_setting(close, [85, 86, 87], [86, 86, 86])
    inside = v2.curve_agreement(list(v2.first_setting_curves(close, "acc").values()),
                                v2.reference_curves(close / "reference.json")).inside
    marked = [r for r in v2.rounds_report(close, v2.first_setting_curves).splitlines()[2:] if "*" in r[:6]]
    assert inside == 11 == sum(r.endswith("yes") for r in marked)
    assert v2.curve_agreement(list(ours.values()), theirs).inside == 0
    assert v2.main(["rounds", str(close)]) == 0
    (close / "reference.json").write_text(json.dumps({"runs": []}))
    with pytest.raises(ValueError, match="both sides"):
        v2.rounds_report(close, v2.first_setting_curves)


def test_left_lists_missing_seeds_at_their_runs_commit_and_references_short_of_three(v2, tmp_path):
    """``validation2.py left``: a queue line per missing seed (at the commit and minutes of the method's runs; HEAD
    and ``?`` without runs), a cut run counted as missing, a diverged one as done; a comment per method whose first
    setting has a reference and whose second-setting reference has fewer than three runs."""
    configs, results = tmp_path / "configs", tmp_path / "results" / "validation-2"
    configs.mkdir()
    for m in ("ditto", "fedrep", "apple"):
        (configs / f"{m}.toml").write_text("")
    _runs(results / "ditto", [85])
    run = results / "ditto" / "fedblend" / "seed0"
    (run / "config.toml").write_text("# git_commit: abc123+dirty\nmethod = 'ditto'\n")
    (run / "summary.json").write_text(json.dumps({"status": "finished", "seconds_per_round": 6.0, "rounds": 50}))
    cut = results / "ditto" / "fedblend" / "seed1"
    cut.mkdir()
    (cut / "summary.json").write_text(json.dumps({"status": "running"}))
    for seed in range(3):  # every APPLE seed diverged: a result, nothing left to run
        d = results / "apple" / "fedblend" / f"seed{seed}"
        d.mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps({"status": "diverged", "diverged_round": 1}))
        (d / "metrics.jsonl").write_text(json.dumps({"round": 1, "acc": 0.1}) + "\n")
    (results / "ditto" / "reference.json").write_text(json.dumps({"runs": [[0.9] * 50] * 3}))
    first = tmp_path / "results" / "validation"
    for m in ("ditto", "fedrep"):
        (first / m).mkdir(parents=True)
        (first / m / "reference.json").write_text(json.dumps({"acc": [0.9] * 20}))
    lines = v2.left(configs, results)
    assert lines == [
        f"5\tabc123\tfedblend run {configs.as_posix()}/ditto.toml --set seed=1 --out runs/validation-2/ditto/seed1",
        f"5\tabc123\tfedblend run {configs.as_posix()}/ditto.toml --set seed=2 --out runs/validation-2/ditto/seed2",
        *(f"?\tHEAD\tfedblend run {configs.as_posix()}/fedrep.toml --set seed={s} --out runs/validation-2/fedrep/seed{s}"
          for s in range(3)),
        f"# reference fedrep: 0 of 3 runs in {results / 'fedrep' / 'reference.json'}"]
