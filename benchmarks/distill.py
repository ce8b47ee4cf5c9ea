"""Deep to light on Multi30k de-en at CPU scale (issue 46, item 5): a teacher, the same student
trained four ways at equal training time, and the decoding speed of teacher and student in
fairseq-generate and of the student in CTranslate2, in one run.

    python -m benchmarks.distill [--multi30k /work/shared/data/multi30k] [--work-dir bench_runs/distill]
        [--teacher CK.pt [--distilled DIR] | --teacher-minutes 30 [--teacher-layers 24 6]]
        [--gpkd-teacher CK.pt]
        [--minutes 10]
        [--width 128] [--student-layers 6 6] [--train-sentences N] [--test-sentences 1000]
        [--systems original,distilled,word,gpkd] [--beam 5 --batch 32 --max-len 60 --threads 2]

Steps (each kept in ``--work-dir`` and reused when run again with the same options; a training
run resumes its checkpoint_last.pt, fairseq-deep-distill resumes by itself):

1. Multi30K (the raw gzip folder, read from there, never copied into the repository; the first
   ``--train-sentences`` pairs when given) through ``fairseq-deep-prepare`` into the work folder
   (benchmarks/export_speed.py's preparation);
2. the teacher: ``--teacher`` (a checkpoint trained on that data-bin, whose dictionaries it must
   have), else the own-data recipe's ``transformer_dlcl`` at ``--width`` (6 + 6 layers, or
   ``--teacher-layers``) trained for ``--teacher-minutes`` (the recipe's settings:
   fairseq_deep/own_data.py);
3. its translations of the training set (``fairseq-deep-distill``, the recipe's beam search;
   its rate in sentences/s and the hours a WMT-sized set would take at it:
   :func:`distillation_speed`), or ``--distilled``, that teacher's (another student shape on the
   same teacher);
4. the student (``transformer_prenorm`` at ``--width``, ``--student-layers`` deep) trained for
   ``--minutes`` each (fairseq's ``--stop-time-hours``: equal training time, the time checked
   afterwards from each checkpoint's own clock), on: ``original`` data; ``distilled`` data;
   ``word``: the original data with ``--criterion word_distillation`` (the teacher's
   distributions; the teacher's forward passes count in its time); ``gpkd``: extracted
   (``fairseq-deep-extract``) from a pre-norm teacher of twice the student's encoder layers in
   ``--student-layers[0]`` groups (``--gpkd-teacher``, else trained for ``--teacher-minutes``),
   then fine-tuned on the distilled data, as the paper does;
5. every system's test translations in fairseq-generate (sacreBLEU, chrF, the paired bootstrap of
   each student against ``original``: sacreBLEU's, :func:`fairseq_deep.runs.paired_bootstrap`),
   and the ``distilled`` student (without it, the ``gpkd`` one) exported
   (``fairseq-deep-export``) and translating in CTranslate2:
   sentences/s of teacher and student in fairseq-generate (its own ``Translated`` line) and of the
   student in CTranslate2 (the ``translate_batch`` calls), same test set, beam, batch and length
   limit, as ratios to the teacher's fairseq-generate; CTranslate2 twice: loaded as a new user
   loads it (``--compute-type``, ``--threads`` intra-op threads) and as the export's timing finds
   fastest here (:func:`fastest_serving`).

On a GPU (``--device cuda --precision fp16``, the GPU window's ``distill_gpu`` step): the same
at Base width, every training, the distillation and fairseq-generate in that precision; where
CTranslate2 cannot run there, its rows are left out with why (:func:`ctranslate2_rows`) and the
run exits non-zero after writing the rest.

Writes ``WORK_DIR/results.json`` and ``WORK_DIR/results.md`` (the table, printed too).  What a run
costs: the teachers' minutes (none with ``--teacher``/``--gpkd-teacher``), the distillation of
the training set at the teacher's speed, ``--minutes`` per student system, and the decoding; the
plan is said at the start.
"""

if __name__ == "__main__" and not __package__:  # run as a file, the package's imports would fail
    raise SystemExit(
        "benchmarks/distill.py is a module of the benchmarks package: run it from the "
        "repository root as python -m benchmarks.distill"
    )

import dataclasses
import gzip
import json
import os
import sys
import time
from typing import Dict, List, Optional, Sequence

from fairseq_deep import own_data, progress, serving
from fairseq_deep.models import families
from fairseq_deep.runs import Part, Run, flags, paired_bootstrap, recipes, restore_flags, score

from . import export_speed, harness

log = harness.logger("distill")
#: the students trained at equal time, in the table's order
SYSTEMS = ("original", "distilled", "word", "gpkd")
#: the baseline of the paired bootstrap
BASELINE = "original"
#: a system whose training clock is off the budget by more than this share is flagged
TIME_TOLERANCE = 0.15
TEACHER_ARCH = "transformer_dlcl"
STUDENT_ARCH = "transformer_prenorm"
#: a WMT-sized training set (WMT'14/'16 En-De as the papers use it: 4.5M pairs), to which the
#: teacher's distillation speed is extrapolated (at this data's sentence lengths)
WMT_PAIRS = 4_500_000


# ------------------------------------------------------------------------------ the budget's logic


def plan_minutes(
    minutes: float, teacher_minutes: float, teachers_to_train: int, systems: Sequence[str]
) -> Dict[str, float]:
    """The training minutes of each run (equal for every student system), and ``total``: what a
    run trains in all (distillation and decoding come on top)."""
    out = {f"teacher {i + 1}": float(teacher_minutes) for i in range(teachers_to_train)}
    out.update({name: float(minutes) for name in systems})
    out["total"] = sum(out.values())
    return out


def unequal_time(trained_s: Dict[str, Optional[float]], minutes: float) -> List[str]:
    """The systems whose training time (seconds, from their checkpoint's clock; None: unknown) is
    off ``minutes`` by more than :data:`TIME_TOLERANCE`, each with why."""
    budget = minutes * 60
    out = []
    for name, seconds in trained_s.items():
        if seconds is None:
            out.append(f"{name}: training time unknown")
        elif abs(seconds - budget) > TIME_TOLERANCE * budget:
            out.append(f"{name}: trained {seconds:.0f} s of {budget:.0f} s")
    return out


def distillation_speed(log_text: str, seconds: float, pieces: Optional[float]) -> Optional[Dict]:
    """The teacher's translation of the training set: fairseq-deep-distill's last progress line
    (sentences and its rate, decoding alone: the teacher's loading is left out), the process's
    wall ``seconds``, the source sentences' mean length in ``pieces`` (EOS included), and the
    hours a WMT-sized set (:data:`WMT_PAIRS`) would take at that rate and these lengths.  None
    where the log has no progress line (a distillation that was already complete)."""
    found = progress.last_decoding_rate(log_text)
    if found is None:
        return None
    done, total, rate = found
    return {
        "sentences": total,
        "decoded": done,
        "sentences_per_s": rate,
        "seconds": seconds,
        "source_pieces_per_sentence": pieces,
        "wmt_pairs": WMT_PAIRS,
        "wmt_hours": WMT_PAIRS / rate / 3600,
    }


def source_pieces(data: str) -> float:
    """The mean length (pieces, EOS included) of the training set's source sentences."""
    from fairseq.data import data_utils

    dataset = data_utils.load_indexed_dataset(os.path.join(data, "train.de-en.de"))
    # the sizes are a view of the dataset's index, unmapped when the dataset is collected
    return float(dataset.sizes.mean())


# ---------------------------------------------------------------------------------------- output


def _cell(value, fmt="{:.2f}") -> str:
    return "-" if value is None else fmt.format(value)


def table(results: Dict) -> str:
    """The markdown table of ``results`` (what :func:`main` writes to results.json)."""
    rows = []
    for name, r in results["systems"].items():
        rows.append(
            [
                name,
                r.get("what", ""),
                _cell(r.get("minutes"), "{:.1f}"),
                _cell(r.get("updates"), "{:,}"),
                _cell(r.get("bleu")),
                _cell(r.get("chrf")),
                _cell(r.get("bleu_p"), "{:.3f}"),
                _cell(r.get("sentences_per_s"), "{:.1f}"),
                _cell(r.get("speed_ratio"), "{:.2f}x"),
            ]
        )
    header = [
        "system",
        "what",
        "train min",
        "updates",
        "BLEU",
        "chrF",
        f"p (BLEU vs {BASELINE})",
        "sent/s",
        "vs teacher",
    ]
    text = harness.markdown_table(header, rows)
    notes = list(results.get("notes") or [])
    d = results.get("distillation")
    if d:
        notes.append(
            f"the teacher translated the training set ({d['sentences']:,} sentences, "
            f"{d['source_pieces_per_sentence']:.1f} source pieces each) at "
            f"{d['sentences_per_s']:,.1f} sentences/s ({d['seconds']:.0f} s with its start); a "
            f"WMT-sized set ({d['wmt_pairs'] / 1e6:g}M pairs) would take {d['wmt_hours']:.1f} "
            "hours at that rate, longer as its sentences are longer"
        )
    return text + ("\n\n" + "\n".join(f"- {n}" for n in notes) if notes else "")


def write_results(results: Dict, work: str) -> str:
    """results.json and results.md in ``work``; returns the table."""
    text = table(results)
    harness.write_json(os.path.join(work, "results.json"), results)
    with open(os.path.join(work, "results.md"), "w", encoding="utf-8") as f:
        f.write(text + "\n")
    return text


def compare(refs: Sequence[str], hyps: Dict[str, Sequence[str]], n_samples: int = 1000) -> Dict:
    """sacreBLEU and chrF of each system, and the paired bootstrap of each but :data:`BASELINE`
    against it: ``{name: {"bleu", "chrf", "bleu_p", "chrf_p"}}``."""
    out = {name: score(h, refs) for name, h in hyps.items()}
    if BASELINE in hyps:
        others = {k: v for k, v in hyps.items() if k != BASELINE}
        for name, p in paired_bootstrap(hyps[BASELINE], others, refs, n_samples).items():
            out[name].update(p)
    return out


# ----------------------------------------------------------------------------------------- runs

#: the row of the served student (distilled, else GPKD) as fairseq-deep-export's timing finds fastest
FASTEST = "ctranslate2 fastest"


def fastest_serving(a, model: str, pieces):
    """Every way of serving ``model`` that fairseq-deep-export times (CTranslate2's backends, each
    in its own process, x compute types x thread layouts of ``--threads`` cores), each on the whole
    test set with the benchmark's beam, batch and length limit, after a warm-up batch: the fastest
    setting (its ``sentences_per_s`` and ``hypotheses``) and the timing record without hypotheses
    (for results.json)."""
    record = serving.time_serving(
        model,
        pieces,
        device=a.device,
        threads=a.threads,
        beam=a.beam,
        max_len_b=a.max_len,
        batch=a.batch,
        rounds=1,
        keep_hypotheses=True,
    )
    best = dict(max(record["settings"], key=lambda r: r["sentences_per_s"]))
    for row in record["settings"]:
        row.pop("hypotheses")
    return best, record


def ctranslate2_rows(a, model: str, pieces) -> Dict:
    """The exported student in CTranslate2, its two rows (:data:`FASTEST` and ``ctranslate2``,
    loaded as a new user loads it): ``hyps`` (detokenized) and ``speeds`` (sentences/s) by row,
    the ``fastest`` setting and the ``serving`` record (:func:`fastest_serving`).  Where
    CTranslate2 raises (not installed, a device it cannot use: CUDA libraries of another version,
    a compute type it lacks), ``failed`` says why in one line and the rows are left out: the
    other figures of the run are kept."""
    try:
        seconds, default = export_speed.ctranslate2_translate(a, model, a.compute_type, pieces)
        fastest, record = fastest_serving(a, model, pieces)
    except (ImportError, OSError, RuntimeError, ValueError) as e:
        return {"failed": f"CTranslate2 on {a.device} failed: {type(e).__name__}: {e}"}
    hypotheses = [export_speed.detokenize(t) for t in fastest.pop("hypotheses")]
    return {
        "hyps": {"ctranslate2": default, FASTEST: hypotheses},
        "speeds": {"ctranslate2": len(pieces) / seconds, FASTEST: fastest["sentences_per_s"]},
        "fastest": fastest,
        "serving": record,
    }


def run(what, log_path: str, threads: int):
    from fairseq_deep import runs

    return runs.execute(what, log_path, env=harness.thread_env(threads)).check()


def settings(a, work: str) -> own_data.Settings:
    """The own-data recipe's settings on the CPU (its learning rate, warm-up, batch) at --width."""
    env = {"WIDTH": str(a.width), "AVERAGE": "0", "WORK": work}
    env["PRECISION"] = " ".join(recipes.PRECISIONS[a.precision][0])  # fairseq-train's flag
    s = own_data.settings_from_env(env, "cpu")
    if a.device != "cpu":
        s.device = a.device
    return s


def train_seconds(checkpoint: str) -> Optional[float]:
    """The training time a checkpoint's clock says (fairseq's ``previous_training_time``)."""
    from fairseq_deep.checkpoints import load_as_saved

    if not os.path.isfile(checkpoint):
        return None
    extra = load_as_saved(checkpoint).get("extra_state") or {}
    seconds = extra.get("previous_training_time")
    return None if seconds is None else float(seconds)


def updates(checkpoint: str) -> Optional[int]:
    from fairseq_deep.checkpoints import load_as_saved

    if not os.path.isfile(checkpoint):
        return None
    return own_data._num_updates(load_as_saved(checkpoint))


def train(a, work: str, name: str, base: Run, minutes: float) -> str:
    """``base`` (a training run but its save dir and budget) for ``minutes``, resumed when its
    checkpoint_last.pt is there, and not started where that checkpoint's clock has reached
    ``minutes`` already (fairseq, resumed past its --stop-time-hours, would still make an update
    and save it); returns its checkpoint_best.pt."""
    save = os.path.join(work, "checkpoints", name)
    stamp = os.path.join(save, "run.json")
    words = base.plus(recipes.budget(stop_time_hours=minutes / 60)).arguments()
    if os.path.isfile(stamp) and json.load(open(stamp)) != words:
        raise SystemExit(
            f"{save}: trained with other options; delete it or give another --work-dir"
        )
    # a checkpoint is reused only where the stamp says it was trained with these options
    trained = train_seconds(os.path.join(save, "checkpoint_last.pt"))
    if os.path.isfile(stamp) and trained is not None and trained >= minutes * 60:
        log(f"{name}: trained {trained:.0f} s of {minutes * 60:.0f} already ({save})")
        return os.path.join(save, "checkpoint_best.pt")
    os.makedirs(save, exist_ok=True)
    harness.write_json(stamp, words)
    log(f"training {name} for {minutes:g} minutes ({save})")
    run(
        base.plus(
            recipes.saving(save_dir=save, no_epoch_checkpoints=True),
            recipes.budget(stop_time_hours=minutes / 60),
        ),
        os.path.join(work, f"train_{name}.log"),
        a.threads,
    )
    return os.path.join(save, "checkpoint_best.pt")


def student_base(a, s: own_data.Settings, data: str, *more) -> Run:
    spec = families.spec(STUDENT_ARCH)
    return (
        own_data.train_run(s, spec, data, "", [])
        .without("saving")
        .plus(recipes.layers(*a.student_layers), *more)
    )


def prepare(a, work: str) -> str:
    """Multi30k (or its first --train-sentences pairs) prepared in ``work``: the data-bin."""
    if a.train_sentences:
        raw = os.path.join(work, f"raw{a.train_sentences}")
        os.makedirs(raw, exist_ok=True)
        for name in os.listdir(a.multi30k):
            if not name.endswith(".gz"):
                continue
            dest = os.path.join(raw, name)
            if os.path.exists(dest):
                continue
            with gzip.open(os.path.join(a.multi30k, name), "rt", encoding="utf-8") as f:
                lines = f.readlines()
            if name.startswith("train."):
                lines = lines[: a.train_sentences]
            with gzip.open(dest, "wt", encoding="utf-8") as f:
                f.writelines(lines)
        a.multi30k = raw
    return export_speed.prepare(a, work)


def get_parser():
    p = harness.parser(__doc__, full=True)
    p.add_argument("--multi30k", default="/work/shared/data/multi30k", help="raw Multi30K")
    harness.add_work_dir(p, "bench_runs/distill")
    p.add_argument("--teacher", help="the teacher's checkpoint (on this run's data-bin)")
    p.add_argument(
        "--distilled",
        help="the teacher's distilled data-bin (fairseq-deep-distill's, with --teacher)",
    )
    p.add_argument("--gpkd-teacher", help="a GPKD teacher's checkpoint (groups = student layers)")
    p.add_argument("--teacher-minutes", type=float, default=30, help="each teacher trained")
    p.add_argument("--minutes", type=float, default=10, help="each student system's training")
    p.add_argument(
        "--teacher-layers",
        type=int,
        nargs=2,
        metavar=("ENC", "DEC"),
        help="the teacher's depth (default: the own-data recipe's, transformer_dlcl's 6 + 6)",
    )
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--student-layers", type=int, nargs=2, default=[6, 6], metavar=("ENC", "DEC"))
    p.add_argument("--train-sentences", type=int, default=0, help="the first N pairs (0: all)")
    p.add_argument("--test-sentences", type=int, default=1000, help="the first N of test2016")
    p.add_argument("--systems", default=",".join(SYSTEMS), help="a subset of " + ",".join(SYSTEMS))
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--batch", type=int, default=32, help="sentences per batch, every engine")
    p.add_argument("--max-len", type=int, default=60, help="target pieces at most, every engine")
    p.add_argument("--compute-type", default="default", help="CTranslate2's")
    p.add_argument("--bootstrap-samples", type=int, default=1000)
    harness.add_threads(p, 2)
    # --precision: every training's flag and the distillation's and fairseq-generate's
    return harness.add_device_argument(p, precision=True)


def main(argv=None):
    a = get_parser().parse_args(argv)
    harness.device_from_args(a)
    systems = [x for x in a.systems.split(",") if x]
    unknown = [x for x in systems if x not in SYSTEMS]
    if unknown:
        raise SystemExit(f"--systems {','.join(unknown)}: one of {', '.join(SYSTEMS)}")
    for given in (a.teacher, a.gpkd_teacher):
        if given and not os.path.isfile(given):
            raise SystemExit(f"{given}: no such checkpoint")
    if a.distilled and not (
        a.teacher and os.path.isfile(os.path.join(a.distilled, "distill.json"))
    ):
        raise SystemExit(
            f"--distilled {a.distilled}: give fairseq-deep-distill's output (its distill.json) "
            "and the --teacher that wrote it"
        )
    work = a.work_dir
    os.makedirs(work, exist_ok=True)
    to_train = (a.teacher is None) + ("gpkd" in systems and a.gpkd_teacher is None)
    plan = plan_minutes(a.minutes, a.teacher_minutes, to_train, systems)
    log(
        f"plan: {plan['total']:g} minutes of training ("
        + ", ".join(f"{k} {v:g}" for k, v in plan.items() if k != "total")
        + "), then the distillation of the training set and the decoding"
    )
    s = settings(a, work)
    data = os.path.join(prepare(a, work), "data-bin")
    prep = os.path.dirname(data)
    test = data if a.test_sentences >= 1000 else export_speed.test_subset(a, work, prep)
    with open(os.path.join(prep, "spm", "test.de"), encoding="utf-8") as f:
        pieces = [line.split() for line in f.read().splitlines()][: a.test_sentences]
    with gzip.open(os.path.join(a.multi30k, "test_2016_flickr.en.gz"), "rt", encoding="utf-8") as f:
        refs = [line.strip() for line in f][: a.test_sentences]

    teacher = a.teacher or train(
        a,
        work,
        "teacher",
        own_data.train_run(s, families.spec(TEACHER_ARCH), data, "", [])
        .without("saving")
        .plus(recipes.layers(*a.teacher_layers) if a.teacher_layers else None),
        a.teacher_minutes,
    )
    distilled = a.distilled or os.path.join(work, "distilled")
    distillation = None
    if not a.distilled:
        log(f"distilling the training set into {distilled}")
        start, distill_log = time.perf_counter(), os.path.join(work, "distill.log")
        run(
            Run.of(
                "distill",
                data,
                own_data.search(s),
                # the recipe's decoding options, with the precision's decoding flag
                *own_data.on_device(
                    dataclasses.replace(s, precision=" ".join(recipes.PRECISIONS[a.precision][1]))
                ),
                flags({"destdir": distilled, "path": teacher}),
            ),
            distill_log,
            a.threads,
        )
        with open(distill_log, encoding="utf-8") as f:
            distillation = distillation_speed(
                f.read(), time.perf_counter() - start, source_pieces(data)
            )
    checkpoints = {"teacher": teacher}
    if "original" in systems:
        checkpoints["original"] = train(a, work, "original", student_base(a, s, data), a.minutes)
    if "distilled" in systems:
        base = student_base(a, s, distilled)
        checkpoints["distilled"] = train(a, work, "distilled", base, a.minutes)
    if "word" in systems:
        word = (
            student_base(a, s, data)
            .without("criterion")
            .plus(
                recipes.label_smoothed(0.1, criterion="word_distillation"),
                Part("teacher", flags({"teacher_path": teacher, "distill_top_k": 8})),
            )
        )
        checkpoints["word"] = train(a, work, "word", word, a.minutes)
    if "gpkd" in systems:
        gpkd_teacher = a.gpkd_teacher or train(
            a,
            work,
            "gpkd_teacher",
            student_base(
                a,
                s,
                data,
                recipes.layers(2 * a.student_layers[0], a.student_layers[1]),
                Part("gpkd", flags({"gpkd_encoder_groups": a.student_layers[0]})),
            ),
            a.teacher_minutes,
        )
        extracted = os.path.join(work, "gpkd_student.pt")
        if not os.path.isfile(extracted):
            run(
                [sys.executable, "-m", "fairseq_deep.extract", gpkd_teacher]
                + flags({"out": extracted}),
                os.path.join(work, "extract.log"),
                a.threads,
            )
        base = student_base(a, s, distilled, restore_flags(extracted))
        checkpoints["gpkd"] = train(a, work, "gpkd", base, a.minutes)

    hyps, speeds = {}, {}
    for name, ck in checkpoints.items():
        log(f"decoding the test set with {name}")
        seconds, hyps[name] = export_speed.fairseq_generate(
            a, work, test, ck, len(refs), Part("precision", recipes.PRECISIONS[a.precision][1])
        )
        speeds[name] = len(refs) / seconds
    results = {"settings": vars(a), "plan": plan, "systems": {}, "notes": []}
    if distillation:
        results["distillation"] = distillation
    # served by CTranslate2: the student on distilled data, else the GPKD one (every system has
    # the data-bin's dictionaries, which the export reads)
    served = next((n for n in ("distilled", "gpkd") if n in checkpoints), None)
    ct2 = {}
    if served:
        model = export_speed.export(a, work, data, checkpoints[served])
        ct2 = ctranslate2_rows(a, model, pieces)
        hyps.update(ct2.get("hyps", {}))
        speeds.update(ct2.get("speeds", {}))
        if "serving" in ct2:
            results["serving"] = ct2["serving"]
        if "failed" in ct2:
            log(ct2["failed"])
            results["notes"].append(ct2["failed"])
    scores = compare(refs, hyps, a.bootstrap_samples)
    what = {
        "teacher": f"{TEACHER_ARCH} w{a.width}"
        + (" {} + {}".format(*a.teacher_layers) if a.teacher_layers and not a.teacher else "")
        + (" (given)" if a.teacher else ""),
        "original": "student, original data",
        "distilled": "student, distilled data (fairseq-generate)",
        "word": "student, word-level distillation",
        "gpkd": "student, GPKD-extracted + fine-tuned on distilled",
        "ctranslate2": f"the {served} student in CTranslate2 ({a.compute_type})",
    }
    if FASTEST in hyps:
        what[FASTEST] = "the same, as the export finds fastest here: " + serving.setting_name(
            ct2["fastest"]
        )
    trained = {}
    for name in hyps:
        ck = checkpoints.get(name)
        last = os.path.join(os.path.dirname(ck), "checkpoint_last.pt") if ck else None
        seconds = train_seconds(last) if last else None
        if name in SYSTEMS:
            trained[name] = seconds
        results["systems"][name] = {
            "what": what[name],
            "minutes": None if seconds is None else seconds / 60,
            "updates": updates(last) if last else None,
            **scores[name],
            "sentences_per_s": speeds[name],
            "speed_ratio": speeds[name] / speeds["teacher"],
        }
    for line in unequal_time(trained, a.minutes):
        results["notes"].append(f"not equal time: {line}")
    results["notes"].append(
        f"{len(refs)} test sentences, beam {a.beam}, batch {a.batch}, at most {a.max_len} target "
        f"pieces, {a.threads} threads, {harness.describe(a.device)}; every student "
        f"{STUDENT_ARCH} w{a.width} " + "{} + {}".format(*a.student_layers)
    )
    print(write_results(results, work))
    if "failed" in ct2:
        raise SystemExit(f"benchmarks.distill: {ct2['failed']} (the rest is in {work})")


if __name__ == "__main__":
    main()
