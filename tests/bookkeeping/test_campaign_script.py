"""``bookkeeping/campaign.py``: the campaign runner's queue parsing, deadline and agent checks (the runs themselves
are ``fedblend run`` / ``pretrain`` commands, tested elsewhere)."""

import datetime as dt

import pytest

from tests.helpers import load_script


@pytest.fixture(scope="module")
def campaign():
    return load_script("campaign", "bookkeeping")


def test_parse_reads_tables_left_commands_lines_and_skips_comments(campaign):
    text = ("# t4 mnist-domains: comment\n\n"
            "30\tabc123\tfedblend run configs/x.toml --set seed=1 --out runs/t4/x/seed1\n"
            "?\tHEAD\tfedblend pretrain /r/results/p/config.toml --out agents/a.pt\n")
    a, b = campaign.parse(text)
    assert (a.minutes, a.commit, a.args, a.out) == (
        30.0, "abc123", ["run", "configs/x.toml", "--set", "seed=1", "--out", "runs/t4/x/seed1"], "runs/t4/x/seed1")
    assert (b.minutes, b.out) == (60.0, "agents/a.pt")  # no measured time: an hour


@pytest.mark.parametrize("bad", ["30 abc fedblend run x.toml --out o",  # spaces, not tabs
                                 "30\tabc\tpython run x.toml --out o",  # not a fedblend command
                                 "30\tabc\tfedblend run x.toml"])  # no --out
def test_parse_names_a_malformed_line(campaign, bad):
    with pytest.raises(SystemExit, match="line 1 is not MINUTES<TAB>COMMIT<TAB>fedblend"):
        campaign.parse(bad + "\n")


def test_a_line_fits_only_when_its_minutes_with_the_margin_end_before_the_deadline(campaign):
    line = campaign.parse("50\tabc\tfedblend run /c.toml --out o\n")[0]
    assert campaign.fits(line, deadline=1000 + 50 * 60 * campaign.MARGIN, now=1000)
    assert not campaign.fits(line, deadline=1000 + 50 * 60 * campaign.MARGIN - 1, now=1000)
    assert not campaign.fits(line, deadline=1000 + 50 * 60 * campaign.MARGIN, now=1000, scale=1.5)  # a slower machine
    assert campaign.fits(line, deadline=1000 + 75 * 60 * campaign.MARGIN, now=1000, scale=1.5)


def test_deadline_is_today_or_tomorrow_when_the_time_has_passed(campaign):
    now = dt.datetime(2026, 11, 26, 19, 30)
    assert campaign.deadline_of("22:05", now) == dt.datetime(2026, 11, 26, 22, 5).timestamp()
    assert campaign.deadline_of("01:00", now) == dt.datetime(2026, 11, 27, 1, 0).timestamp()


def test_a_run_that_loads_an_agent_waits_until_the_agent_file_exists(campaign, tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('method = "pfedrlla"\n[options]\nagent = "agents/a.pt"\n')
    line = campaign.parse(f"20\tabc\tfedblend run {cfg} --set seed=1 --out runs/x\n")[0]
    other = campaign.parse(f"20\tabc\tfedblend run {cfg} --set options.agent=agents/b.pt --out runs/y\n")[0]
    assert not campaign.ready(line, tmp_path) and not campaign.ready(other, tmp_path)
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents/a.pt").write_bytes(b"")
    assert campaign.ready(line, tmp_path)
    assert not campaign.ready(other, tmp_path)  # the override names another file
    cfg.write_text('method = "fedavg"\n')
    assert campaign.ready(line, tmp_path)  # no agent: ready


def test_a_finished_pretraining_says_whether_its_agent_is_the_committed_one(campaign, tmp_path):
    import hashlib

    run = tmp_path / "results/t4/pretrain/x/seed0"
    run.mkdir(parents=True)
    (run / "config.toml").write_text('method = "pfedrlla"\n')
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents/a.pt").write_bytes(b"agent bytes")
    line = campaign.parse(f"30\tabc\tfedblend pretrain {run / 'config.toml'} --out agents/a.pt\n")[0]
    assert campaign.agent_note(line, tmp_path) == ""  # nothing recorded to compare with
    (run / "agent.sha256").write_text(hashlib.sha256(b"agent bytes").hexdigest() + "  a.pt\n")
    assert campaign.agent_note(line, tmp_path).startswith(" (agent: same sha256 as ")
    (tmp_path / "agents/a.pt").write_bytes(b"other bytes")
    assert " differs from " in campaign.agent_note(line, tmp_path)
    run_line = campaign.parse(f"30\tabc\tfedblend run {run / 'config.toml'} --out runs/r\n")[0]
    assert campaign.agent_note(run_line, tmp_path) == ""


def _run_dir(path, rounds=100, every=10, last_round=None, checkpoint=True):
    path.mkdir(parents=True)
    (path / "config.toml").write_text(f'method = "fedavg"\nrounds = {rounds}\ncheckpoint_every = {every}\n')
    if last_round is not None:
        (path / "metrics.jsonl").write_text("".join(f'{{"round": {r}}}\n' for r in range(1, last_round + 1)))
    if checkpoint:
        (path / "checkpoint.pt").write_bytes(b"")


def test_a_resumed_run_counts_only_the_rounds_after_its_last_checkpoint(campaign, tmp_path):
    line = campaign.parse("50\tabc\tfedblend run /c.toml --out runs/x\n")[0]
    assert campaign.share_left(line, tmp_path) == 1.0  # never started
    _run_dir(tmp_path / "runs/x", rounds=100, every=10, last_round=37)
    assert campaign.share_left(line, tmp_path) == pytest.approx(0.7)  # resumes from the round-30 checkpoint
    now = 1000.0
    deadline = now + 50 * 0.7 * 60 * campaign.MARGIN
    assert campaign.fits(line, deadline, now, share=campaign.share_left(line, tmp_path))
    assert not campaign.fits(line, deadline, now)  # the whole run would not
    pre = campaign.parse("30\tabc\tfedblend pretrain /p.toml --out agents/a.pt\n")[0]
    assert campaign.run_dir(pre, tmp_path) == tmp_path / "agents/a.pt.run"
    _run_dir(tmp_path / "agents/a.pt.run", rounds=50, every=5, last_round=49)
    assert campaign.share_left(pre, tmp_path) == pytest.approx(0.1)
    _run_dir(tmp_path / "runs/y", rounds=100, last_round=37, checkpoint=False)
    assert campaign.share_left(campaign.parse("50\tabc\tfedblend run /c.toml --out runs/y\n")[0], tmp_path) == 1.0


def test_a_cut_run_resumes_from_its_checkpoint_and_one_cut_before_its_first_starts_over(campaign, tmp_path):
    run = campaign.parse("50\tabc\tfedblend run /c.toml --out runs/x\n")[0]
    pre = campaign.parse("30\tabc\tfedblend pretrain /p.toml --out agents/a.pt\n")[0]
    assert campaign.restart_flags(run, tmp_path) == [] and campaign.restart_flags(pre, tmp_path) == []  # new
    (tmp_path / "runs/e").mkdir(parents=True)  # an empty folder: fedblend writes into it
    assert campaign.restart_flags(campaign.parse("50\tabc\tfedblend run /c.toml --out runs/e\n")[0], tmp_path) == []
    _run_dir(tmp_path / "runs/x", last_round=1, checkpoint=False)  # cut in round 2, before its first checkpoint
    assert campaign.restart_flags(run, tmp_path) == ["--force"]
    _run_dir(tmp_path / "agents/a.pt.run", last_round=37)
    assert campaign.restart_flags(pre, tmp_path) == ["--resume"]


def test_pick_starts_lines_that_fit_and_with_fill_the_next_ready_ones_past_the_deadline(campaign, tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('method = "fedavg"\n')
    agent_cfg = tmp_path / "a.toml"
    agent_cfg.write_text('method = "pfedrlla"\n[options]\nagent = "agents/missing.pt"\n')
    long_, waits, short, other = campaign.parse(
        f"90\tabc\tfedblend run {cfg} --out runs/long\n20\tabc\tfedblend run {agent_cfg} --out runs/waits\n"
        f"20\tabc\tfedblend run {cfg} --out runs/short\n80\tabc\tfedblend run {cfg} --out runs/other\n")
    todo, now = [long_, waits, short, other], 0.0
    deadline = 30 * 60 * campaign.MARGIN  # 30 minutes: only "short" fits
    assert campaign.pick(todo, 2, tmp_path, deadline, now) == [(short, False)]
    assert campaign.pick(todo, 2, tmp_path, deadline, now, fill=True) == [(short, False), (long_, True)]
    assert campaign.pick(todo, 1, tmp_path, deadline, now, fill=True) == [(short, False)]
    assert campaign.pick(todo, 0, tmp_path, deadline, now, fill=True) == []
    # the agent's run never starts, not even to fill
    assert waits not in [line for line, _ in campaign.pick(todo, 4, tmp_path, deadline, now, fill=True)]


def test_runs_another_process_writes_take_places_and_stale_or_own_locks_do_not(campaign, tmp_path):
    import subprocess
    import sys

    held, stale, ours = (tmp_path / "runs" / n for n in ("held", "stale", "ours"))
    tree = tmp_path / "tree-abc" / "runs" / "x"
    for d in (held, stale, ours, tree):
        d.mkdir(parents=True)
        (d / ".fedblend.lock").write_text("1\n")  # a file is not a lock: only a held flock counts
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time\n"
         "fds = [os.open(p, os.O_RDWR) for p in sys.argv[1:]]\n"
         "[fcntl.flock(fd, fcntl.LOCK_EX) for fd in fds]\nprint('held', flush=True)\ntime.sleep(60)",
         str(held / ".fedblend.lock"), str(ours / ".fedblend.lock"), str(tree / ".fedblend.lock")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert campaign.busy_elsewhere(tmp_path, {ours.resolve()}) == [held]
        assert campaign.busy_elsewhere(tmp_path, set()) == [held, ours]
    finally:
        holder.kill()
        holder.wait()
    assert campaign.busy_elsewhere(tmp_path, set()) == []  # the kernel released them


def test_a_line_whose_run_wrote_its_summary_is_finished(campaign, tmp_path):
    run = campaign.parse("50\tabc\tfedblend run /c.toml --out runs/x\n")[0]
    pre = campaign.parse("30\tabc\tfedblend pretrain /p.toml --out agents/a.pt\n")[0]
    _run_dir(tmp_path / "runs/x", last_round=37)  # killed after round 37: resumable, not finished
    _run_dir(tmp_path / "agents/a.pt.run", last_round=100)
    assert not campaign.finished(run, tmp_path) and not campaign.finished(pre, tmp_path)
    (tmp_path / "runs/x/summary.json").write_text("{}")
    (tmp_path / "agents/a.pt.run/summary.json").write_text("{}")
    assert campaign.finished(run, tmp_path)
    assert not campaign.finished(pre, tmp_path)  # no agent file yet
    (tmp_path / "agents/a.pt").write_bytes(b"")
    assert campaign.finished(pre, tmp_path)


def test_the_runner_drops_finished_lines_from_the_queue_and_stops_when_nothing_is_left(campaign, tmp_path):
    queue = tmp_path / "queue.txt"
    queue.write_text("50\tabc\tfedblend run /c.toml --out runs/x\n# a comment\n")
    _run_dir(tmp_path / "runs/x", last_round=100)
    (tmp_path / "runs/x/summary.json").write_text("{}")
    assert campaign.main([str(queue), "--until", "23:59", "--base", str(tmp_path), "--fill"]) == 0
    assert "runs/x" not in queue.read_text()
    log = (tmp_path / "campaign.log").read_text()
    assert "skip runs/x: finished already" in log and "nothing left" in log


def test_a_failed_run_keeps_its_line_in_queue_failed_and_the_log_names_its_output(campaign, tmp_path, monkeypatch):
    """The runner drops a line when it starts it; a run that ends with an error gets the line back in
    ``QUEUE.failed`` (a run that succeeds does not), and the log's end line says where its output is."""
    import subprocess
    import sys

    queue = tmp_path / "queue.txt"
    (tmp_path / "c.toml").write_text('method = "fedavg"\n')
    bad, good = (f"50\tabc\tfedblend run {tmp_path / 'c.toml'} --out runs/{name}" for name in ("bad", "good"))
    queue.write_text(f"{bad}\n{good}\n")

    def fake_start(line, base, log, note=""):  # the run itself: exit 1 for runs/bad, 0 for runs/good
        log.write(f"start {line.out}\n")
        return subprocess.Popen([sys.executable, "-c", f"raise SystemExit({int(line.out == 'runs/bad')})"])

    monkeypatch.setattr(campaign, "start", fake_start)
    monkeypatch.setattr(campaign, "POLL_SECONDS", 0.1)
    monkeypatch.setattr(campaign, "head", lambda: "abc")
    assert campaign.main([str(queue), "--until", "23:59", "--base", str(tmp_path), "--fill"]) == 0
    assert queue.read_text() == ""
    assert (tmp_path / "queue.txt.failed").read_text() == bad + "\n"
    log = (tmp_path / "campaign.log").read_text()
    assert f"end rc=1 runs/bad (failed: see runs/bad.log; its line is kept in {queue}.failed)" in log
    assert "end rc=0 runs/good\n" in log
    assert (tmp_path / "queue.txt.running").read_text() == ""  # both ended: no line left to requeue


def test_a_line_whose_runner_was_stopped_comes_back_at_the_queue_head(campaign, tmp_path, monkeypatch):
    """A session's end stops the runner and its run (here: the runner interrupted while its run is going): the
    next runner finds the line in ``QUEUE.running`` and starts it first, ahead of the queue's other lines."""
    import subprocess
    import sys

    queue = tmp_path / "queue.txt"
    (tmp_path / "c.toml").write_text('method = "fedavg"\n')
    cut, other = (f"50\tabc\tfedblend run {tmp_path / 'c.toml'} --out runs/{name}" for name in ("cut", "other"))
    queue.write_text(f"{cut}\n")
    procs = []

    def fake_start(line, base, log, note=""):
        procs.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]))
        return procs[-1]

    def stop(_seconds):
        raise KeyboardInterrupt  # the session ends while the run goes on

    monkeypatch.setattr(campaign, "start", fake_start)
    monkeypatch.setattr(campaign, "head", lambda: "abc")
    monkeypatch.setattr(campaign.time, "sleep", stop)
    try:
        with pytest.raises(KeyboardInterrupt):
            campaign.main([str(queue), "--until", "23:59", "--base", str(tmp_path), "--jobs", "1"])
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert queue.read_text() == "" and (tmp_path / "queue.txt.running").read_text() == cut + "\n"
    queue.write_text(f"{other}\n")  # someone queued more meanwhile
    _run_dir(tmp_path / "runs/cut", last_round=37)  # what the stopped run left: a checkpoint, no summary
    with open(tmp_path / "campaign.log", "a") as log:
        assert [line.text for line in campaign.requeue_cut(queue, tmp_path, log)] == [cut]
    assert queue.read_text() == f"{cut}\n{other}\n"  # first, and resumed: --resume from its checkpoint
    assert campaign.restart_flags(campaign.parse(cut)[0], tmp_path) == ["--resume"]
    assert (tmp_path / "queue.txt.running").read_text() == ""
    assert "requeue runs/cut: an earlier runner started it and stopped before it ended" in (
        tmp_path / "campaign.log").read_text()


def test_requeue_drops_finished_runs_and_leaves_runs_a_live_process_writes(campaign, tmp_path):
    import subprocess
    import sys

    queue = tmp_path / "queue.txt"
    lines = {n: f"50\tabc\tfedblend run /c.toml --out runs/{n}" for n in ("done", "live", "cut")}
    queue.write_text("")
    (tmp_path / "queue.txt.running").write_text("".join(t + "\n" for t in lines.values()))
    for n in lines:
        _run_dir(tmp_path / "runs" / n, last_round=50)
    (tmp_path / "runs/done/summary.json").write_text("{}")
    (tmp_path / "runs/live/.fedblend.lock").write_text("1\n")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time\nfd = os.open(sys.argv[1], os.O_RDWR)\n"
         "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(60)",
         str(tmp_path / "runs/live/.fedblend.lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with open(tmp_path / "campaign.log", "a") as log:
            back = campaign.requeue_cut(queue, tmp_path, log)
    finally:
        holder.kill()
        holder.wait()
    assert [line.out for line in back] == ["runs/cut"]
    assert queue.read_text() == lines["cut"] + "\n"
    assert (tmp_path / "queue.txt.running").read_text() == lines["live"] + "\n"
