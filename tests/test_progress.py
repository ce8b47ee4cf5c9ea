"""fairseq-deep-train's and fairseq-deep-generate's progress lines (issue 26, item 2): a line after
the first update (or batch), then one every 30 s, with the ETA; driven here by a fake clock on
fakes of fairseq_cli's train and generate modules (the real scripts: tests/test_cli_errors.py)."""

import logging
import types

from fairseq_deep import progress as P
from fairseq_deep.patches.decoding_progress import _Proxy, install_decoding_progress
from fairseq_deep.patches.training_progress import install_training_progress


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def lines(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "fairseq_deep.progress"]


def test_hms():
    assert P.hms(0) == "0:00:00" and P.hms(3725.4) == "1:02:05" and P.hms(None) == "?"
    assert P.hms(float("inf")) == "?"


def test_training_lines_every_interval_with_the_soonest_end(caplog):
    caplog.set_level(logging.INFO, logger="fairseq_deep.progress")
    clock = Clock()
    progress = P.TrainingProgress(max_update=100, stop_time_hours=0.05, interval=30, clock=clock)
    clock.t = 2.0  # the first update: at once, its rate from its own time (start-up included)
    progress.step(1, words=100, training_seconds=3.0)
    assert lines(caplog) == [
        "progress: update 1/100 (1.0%) | 0.5 updates/s | elapsed 0:00:02 | "
        "ETA 0:02:57 (--stop-time-hours 0.05)"
    ]  # 180 - 3 s < 99 updates at 0.5/s
    for u in range(2, 32):  # one update a second, 100 words each: the next line after 30 s
        clock.t += 1.0
        progress.step(u, words=100, training_seconds=clock.t + 1)
    assert len(lines(caplog)) == 2
    # 30 updates in 30 s; --max-update: 69 left -> 69 s; --stop-time-hours 0.05 (180 s) - 33 s = 147 s
    assert lines(caplog)[-1] == (
        "progress: update 31/100 (31.0%) | 100 words/s | 1 updates/s | "
        "elapsed 0:00:32 | ETA 0:01:09 (--max-update 100)"
    )
    progress.max_update = 1000  # now the time budget ends first
    assert progress.line(31, training_seconds=33.0).endswith("ETA 0:02:27 (--stop-time-hours 0.05)")


def test_training_eta_by_epochs_and_without_bounds():
    clock = Clock()
    progress = P.TrainingProgress(max_epoch=3, interval=30, clock=clock)
    clock.t = 1.0
    progress.step(1)
    clock.t = 11.0
    progress.set_epoch(2, 0.5, 20)  # half of epoch 2 of 3 done, 20 updates an epoch: 30 left
    line = progress.line(11)
    assert "epoch 2 (50%)" in line and line.endswith("ETA 0:00:30 (--max-epoch 3)"), line
    free = P.TrainingProgress(interval=30, clock=clock)
    assert free.line(5).endswith("no ETA (no --max-update, --max-epoch or --stop-time-hours)")


def test_install_training_progress_wraps_each_trainers_train_step(caplog):
    """On a fake fairseq_cli.train: train() is wrapped once, the trainer's train_step on the instance;
    skipped updates (train_step returns None) log nothing."""
    caplog.set_level(logging.INFO, logger="fairseq_deep.progress")
    clock = Clock()

    class Trainer:
        updates = 0

        def train_step(self, samples):
            if samples == "overflow":
                return None
            clock.t += 1.0
            self.updates += 1
            return {"loss": 1.0}

        def get_num_updates(self):
            return self.updates

        def cumulative_training_time(self):
            return clock.t

    class EpochItr:
        epoch, iterations_in_epoch = 1, 0

        def __len__(self):
            return 50

    def train(cfg, trainer, task, epoch_itr):
        for samples in ["a", "overflow"] + ["b"] * 40:
            epoch_itr.iterations_in_epoch += 1
            trainer.train_step(samples)
        return [None], False

    module = types.SimpleNamespace(train=train)
    install_training_progress(module, interval=30, clock=clock)
    install_training_progress(module, interval=30, clock=clock)  # idempotent
    assert module.train._fairseq_deep and module.train is not train
    cfg = types.SimpleNamespace(
        optimization=types.SimpleNamespace(
            max_update=82, max_epoch=0, stop_time_hours=0, update_freq=[1]
        )
    )
    trainer = Trainer()
    module.train(cfg, trainer, None, EpochItr())
    out = lines(caplog)
    assert len(out) == 2 and out[0].startswith("progress: update 1/82 (1.2%) | epoch 1 (2%)"), out
    assert out[1].startswith("progress: update 31/82"), out  # 30 s after the first
    assert out[1].endswith("ETA 0:00:51 (--max-update 82)"), out  # 1 update/s, 51 left


def test_install_decoding_progress_counts_sentences(caplog):
    """On a fake fairseq_cli.generate: the task's batch iterator gives the number of sentences, the
    progress bar's iterator counts them after each batch is decoded."""
    caplog.set_level(logging.INFO, logger="fairseq_deep.progress")
    clock = Clock()
    batches = [list(range(10))] * 9 + [list(range(5))]  # 95 sentences

    class Task:
        def get_batch_iterator(self, **kwargs):
            return types.SimpleNamespace(frozen_batches=batches)

    class Bar:
        def __init__(self, itr):
            self.itr = itr

        def __iter__(self):
            return iter(self.itr)

        def log(self, stats):
            self.logged = stats

    tasks = types.SimpleNamespace(setup_task=lambda cfg: Task(), other="kept")
    bars = types.SimpleNamespace(progress_bar=lambda itr, **kw: Bar(itr))
    module = types.SimpleNamespace(tasks=tasks, progress_bar=bars)
    install_decoding_progress(module, interval=30, clock=clock)
    assert module.tasks.other == "kept"
    task = module.tasks.setup_task(None)
    itr = task.get_batch_iterator(dataset=None)
    bar = module.progress_bar.progress_bar([{"nsentences": len(b)} for b in itr.frozen_batches])
    for _sample in bar:
        clock.t += 10.0  # ten seconds a batch
    bar.log({"x": 1})
    assert bar.logged == {"x": 1}  # the rest of the bar is fairseq's
    out = lines(caplog)
    assert (
        out[0]
        == "progress: 10/95 sentences (10.5%) | 1.0 sentences/s | elapsed 0:00:10 | ETA 0:01:25"
    )
    assert (
        out[1]
        == "progress: 40/95 sentences (42.1%) | 1.0 sentences/s | elapsed 0:00:40 | ETA 0:00:55"
    )
    assert len(out) == 4  # 10, 40, 70 and 95 (at 100 s) sentences


def test_interval_from_the_environment(monkeypatch):
    monkeypatch.setenv(P.INTERVAL_ENV, "5")
    assert P.interval_seconds() == 5.0
    monkeypatch.setenv(P.INTERVAL_ENV, "0")
    module = types.SimpleNamespace(train=lambda *a: None)
    install_training_progress(module)
    assert not getattr(module.train, "_fairseq_deep", False)  # 0: no progress lines
    monkeypatch.setenv(P.INTERVAL_ENV, "soon")
    assert P.interval_seconds() == P.DEFAULT_INTERVAL


def fake_generate(batches):
    """A fake fairseq_cli.generate: its task's batch iterator holds ``batches`` (lists of ids)."""

    class Task:
        def get_batch_iterator(self, **kwargs):
            return types.SimpleNamespace(frozen_batches=batches)

    tasks = types.SimpleNamespace(setup_task=lambda cfg: Task())
    bars = types.SimpleNamespace(progress_bar=lambda itr, **kw: iter(itr))
    return types.SimpleNamespace(tasks=tasks, progress_bar=bars)


def decode(module, seconds_per_batch, clock):
    """fairseq's loop: every batch the bar yields is decoded (the fake clock advances: by
    ``seconds_per_batch``, or by the next of a list of them).  The sizes of the batches decoded."""
    itr = module.tasks.setup_task(None).get_batch_iterator(dataset=None)
    times = iter(seconds_per_batch if isinstance(seconds_per_batch, list) else [])
    decoded = []
    for sample in module.progress_bar.progress_bar(
        [{"nsentences": len(b), "id": b} for b in itr.frozen_batches]
    ):
        clock.t += next(times, seconds_per_batch)
        decoded.append(sample["nsentences"])
    return decoded


def test_decoding_starts_no_batch_after_the_deadline_and_says_how_many(caplog):
    """Issue 26: FAIRSEQ_DEEP_DEADLINE.  From t=1000, deadline 1040: three batches of 1 s (all the
    rest would fit at that speed), then one of 20 s that ends at 1023; the plan, made again, keeps
    a subset, but its next batch (20 s, as the last took) would end at 1043, after the deadline:
    not started, and the warning says so."""
    caplog.set_level(logging.INFO, logger="fairseq_deep.progress")
    clock = Clock()
    clock.t = 1000.0
    module = fake_generate([list(range(10))] * 9 + [list(range(5))])  # 95 sentences
    install_decoding_progress(module, interval=0, clock=clock, deadline=1040.0, wall_clock=clock)
    assert decode(module, [1.0, 1.0, 1.0] + [20.0] * 7, clock) == [10] * 4
    warnings = [
        r
        for r in caplog.records
        if r.name == "fairseq_deep.progress" and r.levelno == logging.WARNING
    ]
    said = [w.getMessage() for w in warnings]
    assert len(said) == 2 and said[0].startswith(P.DECODE_SUBSET), (
        said
    )  # interval 0: no progress lines
    message = said[1]
    assert message.startswith(P.DEADLINE_STOP) and "40 of 95 sentences decoded" in message, message
    assert "FAIRSEQ_DEEP_DEADLINE" in message


def test_the_speed_measured_decides_between_the_whole_test_set_and_a_subset(caplog):
    """Issue 40: how much of the test set a deadline leaves time for is decided from the speed
    measured on the batches decoded, never from an estimate made before.  The plan: every batch
    still to come when they fit in the time left at the speed measured; else an evenly spaced
    subset of them of the tokens that fit; none when no time is left."""
    assert P.decoding_plan([10.0] * 10, rate=1.0, seconds_left=100.0) == list(range(10))
    assert P.decoding_plan([10.0] * 10, rate=1.0, seconds_left=50.0) == [1, 3, 5, 7, 9]
    assert P.decoding_plan([10.0] * 10, rate=2.0, seconds_left=25.0) == [1, 3, 5, 7, 9]
    assert P.decoding_plan([10.0] * 10, rate=1.0, seconds_left=0.0) == []
    assert P.decoding_plan([], rate=1.0, seconds_left=0.0) == []
    caplog.set_level(logging.INFO, logger="fairseq_deep.progress")
    # ten batches of 10 sentences, in fairseq's order (by length)
    batches = [list(range(i, i + 10)) for i in range(0, 100, 10)]
    # fast: 1 s a batch from t=1000 with 60 s left: all of them, said once with the speed
    clock = Clock()
    clock.t = 1000.0
    fast = fake_generate(batches)
    install_decoding_progress(fast, interval=0, clock=clock, deadline=1060.0, wall_clock=clock)
    assert decode(fast, 1.0, clock) == [10] * 10
    assert lines(caplog) == [
        f"{P.DECODE_WHOLE}: at 10.0 sentences/s, measured on the 1 batch decoded "
        "here, the 90 sentences left take about 9 s, and 59 s are left before the deadline "
        "(FAIRSEQ_DEEP_DEADLINE)"
    ]
    # slow: 10 s a batch, 60 s left: after the first batch, 50 s of the 90 s that the
    # other nine would take: five of them (evenly spaced, so every length), no batch cut by the
    # deadline, and the line says how much more time would decode all
    caplog.clear()
    clock.t = 1000.0
    slow = fake_generate(batches)
    install_decoding_progress(slow, interval=0, clock=clock, deadline=1060.0, wall_clock=clock)
    decoded_ids = []
    real = slow.progress_bar.progress_bar
    slow.progress_bar.progress_bar = lambda itr, **kw: (
        decoded_ids.append(s["id"][0]) or s for s in real(itr, **kw)
    )
    assert decode(slow, 10.0, clock) == [10] * 6 and clock.t == 1060.0
    assert decoded_ids == [0, 20, 40, 60, 80, 90]  # every length: from the shortest to the longest
    assert lines(caplog) == [
        f"{P.DECODE_SUBSET} (the speed measured): at 1.0 sentences/s, measured on the "
        "1 batch decoded here, the 90 sentences left would take about 90 s, and 50 s are left before the "
        "deadline (FAIRSEQ_DEEP_DEADLINE): decoding 60 of 100 sentences, evenly spaced batches of the "
        "test set sorted by length (every length is in it); about 40 s more would decode all"
    ]


def test_decoding_decodes_the_first_batch_even_after_the_deadline_and_all_before_it(caplog):
    caplog.set_level(logging.INFO, logger="fairseq_deep.progress")
    clock = Clock()
    clock.t = 2000.0
    late = fake_generate([list(range(10))] * 3)
    install_decoding_progress(late, interval=0, clock=clock, deadline=1000.0, wall_clock=clock)
    assert decode(late, 1.0, clock) == [10]  # one batch: fairseq's summary needs a decoding time
    assert (
        "10 of 30 sentences decoded" in lines(caplog)[-1]
        and "passed 1001 s ago" in lines(caplog)[-1]
    )
    caplog.clear()
    early = fake_generate([list(range(10))] * 3)
    install_decoding_progress(
        early, interval=0, clock=clock, deadline=clock.t + 100, wall_clock=clock
    )
    assert decode(early, 1.0, clock) == [10, 10, 10]
    assert [x.split(":")[0] for x in lines(caplog)] == [P.DECODE_WHOLE]  # and no stop


def test_deadline_from_the_environment(monkeypatch, caplog):
    monkeypatch.delenv(P.DEADLINE_ENV, raising=False)
    assert P.deadline_from_env() is None
    monkeypatch.setenv(P.DEADLINE_ENV, "1700000000")
    assert P.deadline_from_env() == 1700000000.0
    monkeypatch.setenv(P.INTERVAL_ENV, "0")  # progress lines off: the deadline is installed anyway
    module = fake_generate([[0]])
    install_decoding_progress(module)
    assert isinstance(module.progress_bar, _Proxy)
    monkeypatch.setenv(P.DEADLINE_ENV, "soon")
    assert P.deadline_from_env() is None and "not a Unix time" in caplog.text


# -- issue 32: a budget too small to learn; decoding a subset ------------------------------------------


def test_a_budget_too_small_to_learn_is_said_after_the_first_updates_with_the_minutes_that_would(
    caplog,
):
    """0.2 updates/s under --stop-time-hours 0.05 (180 s) with 400 warm-up updates: after the first
    update and 10 more (50 s, 55 s of training), about 36 updates are in reach; 400 need
    55 + 389 / 0.2 = 2,000 s of training, and with the recipe's 120 s outside training,
    MINUTES=ceil(2,120 / 60) = 36.  Once; not at 10 updates/s, nor under a --max-update in reach."""
    caplog.set_level(logging.INFO, logger="fairseq_deep.progress")
    clock = Clock()
    budget = P.BudgetCheck(stop_time_hours=0.05, warmup_updates=400, recipe="MINUTES 120")
    progress = P.TrainingProgress(stop_time_hours=0.05, interval=0, clock=clock, budget=budget)
    progress.step(1, training_seconds=5.0)
    for u in range(2, 12):
        clock.t += 5.0
        progress.step(u, training_seconds=5.0 + clock.t)
        assert not caplog.records or u == 11
    [record] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert record.getMessage() == (
        "progress: a budget too small to learn: at 0.2 updates/s, --stop-time-hours 0.05 ends training after about "
        "36 updates, before the end of warm-up (--warmup-updates 400): the model will hardly have learnt. About "
        "0:33:20 of training reach it (--stop-time-hours 0.556); MINUTES=36 would; or a shorter "
        "warm-up (--warmup-updates 18 or less)"  # issue 46: half the updates in reach
    )
    clock.t += 5.0
    progress.step(12, training_seconds=5.0 + clock.t)
    assert len(caplog.records) == 1  # once
    slow = P.BudgetCheck(stop_time_hours=0.05, warmup_updates=400)
    assert slow.warning(4, 3, 60.0, 65.0) is not None  # or after a minute and 3 updates
    # run.sh's budget for 2,000 s of training and 100 s of the rest, decoding taking at most a fifth:
    # all of a 324 s decoding fits a fifth of 2,424 s (41 minutes); of a 3,000 s one a subset, 2,100 / 0.8 s
    assert P.recipe_minutes("MINUTES 100 324 0.2", 2000) == "MINUTES=41"
    assert P.recipe_minutes("MINUTES 100 3000 0.2", 2000) == "MINUTES=44"
    assert P.recipe_minutes(None, 2000) is None and P.recipe_minutes("MINUTES x", 10) is None
    fast = P.BudgetCheck(stop_time_hours=0.05, warmup_updates=400)
    assert fast.warning(11, 10, 1.0, 6.0) is None  # 10 updates/s: 1,750 in reach
    capped = P.BudgetCheck(stop_time_hours=0.05, warmup_updates=400, max_update=15)
    assert capped.warning(11, 10, 100.0, 105.0) is None  # asks for 15 updates only
    no_warmup = P.BudgetCheck(stop_time_hours=0.05)
    assert f"before {P.FEW_UPDATES:,} updates" in no_warmup.warning(11, 10, 100.0, 105.0)
    assert P.BudgetCheck(warmup_updates=400).warning(11, 10, 100.0, 105.0) is None  # no time budget
    assert (
        P.BudgetCheck(stop_time_hours=0.05, warmup_updates=400).warning(5, 4, 20.0, 25.0) is None
    )  # too early


def test_decoding_a_subset_decodes_evenly_spaced_sentences_of_every_length_and_says_so(caplog):
    """FAIRSEQ_DEEP_DECODE_FRACTION=0.3 of 100 sentences in fairseq's order (by length): the
    dataset's ordered_indices give 30 of them, every third-or-so, shortest to longest, and fairseq
    batches only those; the progress counts that subset."""
    import numpy as np

    caplog.set_level(logging.INFO, logger="fairseq_deep.progress")
    assert P.evenly_spaced(10, 0.3) == [3, 6, 9] and P.evenly_spaced(3, 0.01) == [0]

    class Dataset:
        def ordered_indices(self):  # by length: sentence 99 - i is the i-th shortest
            return np.arange(100)[::-1].copy()

    class Task:
        def get_batch_iterator(self, dataset, **kwargs):
            indices = dataset.ordered_indices()
            return types.SimpleNamespace(
                frozen_batches=[indices[i : i + 8] for i in range(0, len(indices), 8)]
            )

    module = types.SimpleNamespace(
        tasks=types.SimpleNamespace(setup_task=lambda cfg: Task()),
        progress_bar=types.SimpleNamespace(progress_bar=lambda itr, **kw: iter(itr)),
    )
    clock = Clock()
    install_decoding_progress(module, interval=30, clock=clock, fraction=0.3)
    itr = module.tasks.setup_task(None).get_batch_iterator(dataset=Dataset())
    decoded = [int(i) for b in itr.frozen_batches for i in b]
    assert decoded == [99 - i for i in P.evenly_spaced(100, 0.3)] and len(decoded) == 30
    assert decoded[0] >= 96 and decoded[-1] <= 3  # from the shortest to the longest
    for _sample in module.progress_bar.progress_bar(
        [{"nsentences": len(b)} for b in itr.frozen_batches]
    ):
        clock.t += 1.0
    said = lines(caplog)
    assert said[0] == (
        f"{P.DECODE_SUBSET} (FAIRSEQ_DEEP_DECODE_FRACTION=0.3): 30 of 100 sentences, evenly spaced over "
        "the test set sorted by length (every length is in it)"
    )
    assert said[1].startswith("progress: 8/30 sentences")


def test_decode_fraction_from_the_environment(monkeypatch, caplog):
    for value, expected in (("", None), ("0.25", 0.25), ("1", None), ("0", None), ("half", None)):
        monkeypatch.setenv(P.DECODE_FRACTION_ENV, value)
        assert P.fraction_from_env() == expected, value
    assert "not a fraction" in caplog.text


def test_the_quickstart_says_how_training_goes(caplog):
    """Issue 32: the quickstart was silent for its minutes of training; it reads fairseq-train's
    train_inner lines as they come and logs a line at once, then at most every 30 s."""
    from fairseq_deep.quickstart import TrainingWatch

    caplog.set_level(logging.INFO, logger="fairseq_deep.quickstart")
    clock = Clock()
    watch = TrainingWatch(2000, interval=30, clock=clock)
    inner = (
        '2026-01-01 10:00:00 | INFO | train_inner | {{"epoch": 1, "update": 0.63, "loss": "9.155", '
        '"nll_loss": "9.046", "ppl": "528.48", "wps": "1200", "num_updates": "{}", "wall": "{}"}}'
    )
    watch("2026-01-01 | INFO | fairseq_cli.train | {'_name': None}")
    clock.t = 25.0
    watch(inner.format(500, 25))
    clock.t = 40.0
    watch(inner.format(800, 40))  # 15 s later: no line
    clock.t = 55.0
    watch(inner.format(1000, 55))
    said = [r.getMessage() for r in caplog.records if r.name == "fairseq_deep.quickstart"]
    assert said == [
        "training: update 500/2,000 (25%) | loss 9.155 | elapsed 0:00:25 | ETA 0:01:15",
        "training: update 1,000/2,000 (50%) | loss 9.155 | elapsed 0:00:55 | ETA 0:00:55",
    ]


def test_the_last_decoding_line_reads_back_as_it_was_written():
    """``last_decoding_rate`` reads what :meth:`DecodingProgress.line` writes (benchmarks/distill.py
    takes the teacher's rate from fairseq-deep-distill's log so): the last line with a rate."""
    clock = Clock()
    progress = P.DecodingProgress(29000, clock=clock)
    written = []
    for _ in range(3):
        clock.t += 12.5
        progress.step(1024)
        written.append(progress.line())
    log = "\n".join(["starting", P.DecodingProgress(10, clock=Clock()).line(), *written, "done"])
    assert P.last_decoding_rate(log) == (3072, 29000, float(f"{3072 / 37.5:.1f}"))
    assert P.last_decoding_rate("no progress here\n") is None
