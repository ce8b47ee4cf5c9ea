"""Named settings of fairseq runs, each written once: the optimisers and schedules of the papers
and of the study (a family's paper recipe, which its declaration holds as data, written here:
:func:`paper`), a fixed learning rate, the criterion, the budget, saving and validation,
decoding, model sizes (a family's ``--width`` rule, explicit sizes, the tests' tiny ones), device
and precision, and json logging.  Each returns a :class:`~fairseq_deep.runs.run.Part` with a
fixed name (or a pair: optimiser, schedule) to compose into a
:class:`~fairseq_deep.runs.run.Run`, which is asked by those names (``run.has("optimizer")``).
No code outside ``runs/`` writes fairseq's training options as words (tests/test_run_settings.py)."""

from typing import Dict, Mapping, Optional, Sequence, Tuple

from ..models.families import Spec
from .run import Part, flags, has_option

#: the warm-up's first learning rate of the inverse_sqrt schedule the study and the recipes use
#: (fairseq's own default is 0 unless --warmup-init-lr is given; Vaswani et al. start near 0)
WARMUP_INIT_LR = "1e-07"

# ---------------------------------------------------------------------------------------------
# optimisers and schedules
# ---------------------------------------------------------------------------------------------


def adam(
    lr=None, betas: Optional[Sequence[float]] = (0.9, 0.98), eps: Optional[str] = None
) -> Part:
    """fairseq's Adam: ``--optimizer adam --adam-betas '(b1, b2)' [--adam-eps E] [--lr LR]``
    (Vaswani et al. 2017 Sec. 5.3 use (0.9, 0.98); ``betas=None``: fairseq's default (0.9,
    0.999), not written; ``eps`` and ``lr`` as the command line writes them)."""
    words = ["--optimizer", "adam"]
    if betas is not None:
        words += ["--adam-betas", f"({betas[0]}, {betas[1]})"]
    if eps is not None:
        words += ["--adam-eps", eps]
    if lr is not None:
        words += ["--lr", lr]
    return Part("optimizer", words)


def inverse_sqrt(warmup, init_lr: Optional[str] = None) -> Part:
    """fairseq's inverse_sqrt schedule: linear warm-up over ``warmup`` updates (from ``init_lr``)
    to ``--lr``, then lr * sqrt(warmup / update) (Vaswani et al. 2017 Eq. 3's shape)."""
    words = ["--lr-scheduler", "inverse_sqrt", "--warmup-updates", warmup]
    if init_lr is not None:
        words += ["--warmup-init-lr", init_lr]
    return Part("schedule", words)


#: Li et al.'s (EMNLP 2020) learning-rate restart as examples/grow/run.sh reads it (the paper's exact
#: restart schedule is not in the project's copies of the papers): a grown stage restores the grown
#: checkpoint with a fresh optimizer and schedule (run.RESET) and warms up again over this fraction
#: of the first stage's warm-up (its WARMUP_RESTART, 1,000 after WARMUP 4,000), then decays from the peak
RESTART_WARMUP = 0.25


def restart(warmup) -> Part:
    """The warm-up of a grown stage's learning-rate restart (:data:`RESTART_WARMUP`): a quarter of
    the first stage's ``warmup`` updates, at least 1 (``--warmup-updates``; the schedule starts
    again under ``--reset-lr-scheduler``)."""
    return Part("restart", ["--warmup-updates", max(1, round(float(warmup) * RESTART_WARMUP))])


def study(lr, warmup) -> Tuple[Part, Part]:
    """The study's shared recipe (also the learning-curve benchmarks'): Adam (0.9, 0.98, eps
    1e-8) to ``lr`` with inverse_sqrt warm-up over ``warmup`` updates from 1e-7."""
    return adam(lr, eps="1e-8"), inverse_sqrt(warmup, WARMUP_INIT_LR)


def paper(arch: Spec, lr, warmup) -> Optional[Tuple[Part, Part]]:
    """The paper's recipe of the family of ``arch`` (a resolved --arch: ``recipe`` of its family's
    declaration, :class:`fairseq_deep.models.families.Recipe`: its optimiser's and schedule's
    settings at the study's ``lr`` and ``warmup``) as (optimiser, schedule); None where the family
    declares none (or ``arch`` is fairseq's own)."""
    if arch.recipe is None:
        return None
    optimizer, schedule = arch.recipe.settings(lr, warmup)
    return Part("optimizer", flags(optimizer)), Part("schedule", flags(schedule))


def learning_rate(value) -> Part:
    """``--lr``: the learning rate of an optimiser given otherwise (a study system's own), the peak
    of a schedule, or the rate of :func:`fixed`."""
    return Part("lr", ["--lr", value])


def fixed() -> Part:
    """fairseq's fixed schedule: ``--lr`` throughout (``--lr-scheduler fixed``)."""
    return Part("schedule", ["--lr-scheduler", "fixed"])


def clip_norm(value) -> Part:
    """fairseq's gradient clipping at norm ``value`` (``0.0``: none; fairseq's default 0.0)."""
    return Part("clipping", ["--clip-norm", value])


def deep_att() -> Part:
    """Deep-Att's paper recipe (Zhou et al. 2016 Sec. 4.3): Adam with fixed learning rates, 4e-5
    for the feed-forward and 5e-4 for the recurrent weights, and L2 regularisation r = 2."""
    return Part(
        "optimizer",
        [
            "--optimizer",
            "deep_att",
            "--deep-att-update-rule",
            "adam",
            "--lr",
            "4e-5",
            "--deep-att-lr-recurrent",
            "5e-4",
            "--l2-strength",
            "2",
            "--lr-scheduler",
            "fixed",
        ],
    )


def noam(r0: float, d_model: int, warmup: int) -> Part:
    """Chen et al. 2018 Eq. 2, the Transformer's schedule (``--lr-scheduler noam``): r0 /
    sqrt(d_model) * min((t + 1) / p^1.5, 1 / sqrt(t + 1))."""
    return Part(
        "schedule",
        [
            "--lr-scheduler",
            "noam",
            "--noam-r0",
            f"{r0:.6g}",
            "--noam-d-model",
            d_model,
            "--warmup-updates",
            warmup,
        ],
    )


def label_smoothed(smoothing=0.1, criterion: str = "label_smoothed_cross_entropy") -> Part:
    """Label-smoothed cross-entropy (Szegedy et al. 2016; Vaswani et al. 2017 Sec. 5.4: 0.1), or
    another ``criterion`` that takes ``--label-smoothing`` (Dou et al.'s
    ``label_smoothed_cross_entropy_with_diversity``)."""
    return Part("criterion", ["--criterion", criterion, "--label-smoothing", smoothing])


#: the option that says a person's own words (a study system's flags, ``--train-args``, a
#: benchmark row's) set what the recipe of that name sets: they replace it, not add to it
DEFINED_BY = {
    "optimizer": "--optimizer",
    "schedule": "--lr-scheduler",
    "criterion": "--criterion",
}


def gives(words: Sequence[str], name: str) -> bool:
    """Whether ``words`` a person wrote set the ``name`` of :data:`DEFINED_BY` (``optimizer``,
    ``schedule``, ``criterion``): a run then takes theirs, not the recipe's."""
    return has_option(words, DEFINED_BY[name])


# ---------------------------------------------------------------------------------------------
# budget, saving and validation, decoding: fairseq's options by name, in the order given
# ---------------------------------------------------------------------------------------------


def _named(name: str, options: Sequence[str], settings: Mapping[str, object]) -> Part:
    """``settings`` (fairseq's option names -> values, :func:`~.run.flags`) as the part ``name``,
    each one of ``options`` (a misspelt name: TypeError)."""
    unknown = [key for key in settings if key not in options]
    if unknown:
        raise TypeError(f"{name}: no option {', '.join(unknown)} (one of {', '.join(options)})")
    return Part(name, flags(settings))


#: what bounds a training run and its batches: tokens (or sentences) a batch, updates, epochs, time
BUDGET = ("max_tokens", "batch_size", "update_freq", "max_update", "max_epoch", "stop_time_hours")
#: a budget's bounds of a run's length (the shell variables of fairseq-deep-grow's next command)
LIMITS = ("max_update", "stop_time_hours", "max_epoch")


def budget(**settings) -> Part:
    """A training run's budget (``budget(max_tokens=4096, max_update=1000)``): the options of
    :data:`BUDGET`, in the order given; None or False: not written."""
    return _named("budget", BUDGET, settings)


#: where and when a training run saves checkpoints and validates (fairseq's checkpoint options and
#: its validation's)
SAVING = (
    "save_dir",
    "no_save",
    "no_epoch_checkpoints",
    "no_last_checkpoints",
    "no_save_optimizer_state",
    "save_interval_updates",
    "keep_interval_updates",
    "keep_last_epochs",
    "keep_best_checkpoints",
    "disable_validation",
    "validate_interval",
    "validate_interval_updates",
    "patience",
)


def saving(**settings) -> Part:
    """Where and when a training run saves and validates (``saving(save_dir=D,
    no_epoch_checkpoints=True)``): the options of :data:`SAVING`, in the order given."""
    return _named("saving", SAVING, settings)


#: what fairseq-generate (or -interactive) decodes and how: the checkpoint, the split, the search,
#: the batches, the length bounds, what is removed from the output
DECODING = (
    "path",
    "gen_subset",
    "beam",
    "nbest",
    "batch_size",
    "max_tokens",
    "lenpen",
    "min_len",
    "max_len_a",
    "max_len_b",
    "remove_bpe",
)


def decoding(**settings) -> Part:
    """How a run decodes (``decoding(beam=5, batch_size=128, max_len_a=1.2, max_len_b=10)``): the
    options of :data:`DECODING`, in the order given."""
    return _named("decoding", DECODING, settings)


def seed(value) -> Part:
    """``--seed``: the run's random seed (parameters, batches, dropout)."""
    return Part("seed", ["--seed", value])


# ---------------------------------------------------------------------------------------------
# device, precision, logging
# ---------------------------------------------------------------------------------------------

#: precision: (fairseq-train flags, fairseq-generate flags); fairseq-generate has no --amp, so
#: AMP-trained models decode in --fp16
PRECISIONS: Dict[str, Tuple[Sequence[str], Sequence[str]]] = {
    "fp32": ([], []),
    "fp16": (["--fp16"], ["--fp16"]),
    "memory_efficient_fp16": (["--memory-efficient-fp16"], ["--fp16"]),
    "amp": (["--amp"], ["--fp16"]),
    "bf16": (["--bf16"], ["--bf16"]),
}


def device(kind: str, precision: str = "fp32", program: str = "train") -> Part:
    """Device and precision flags: ``--cpu`` on CPU; on CUDA a training run gets
    ``--distributed-world-size 1`` (one GPU; fairseq would otherwise train data-parallel on every
    visible GPU); then the precision's flag for ``program`` (:data:`PRECISIONS`)."""
    train = program == "train"
    words = ["--cpu"] if kind == "cpu" else (["--distributed-world-size", "1"] if train else [])
    return Part("device", [*words, *PRECISIONS[precision][0 if train else 1]])


def cpu() -> Part:
    """On the CPU, data loaded in the main process (``--cpu --num-workers 0``)."""
    return Part("device", ["--cpu", "--num-workers", "0"])


def json_log(interval) -> Part:
    """fairseq's ``--log-format json`` every ``interval`` updates (what :func:`~.logs.parse_log`
    reads)."""
    return Part("logging", ["--log-format", "json", "--log-interval", interval])


# ---------------------------------------------------------------------------------------------
# data and text
# ---------------------------------------------------------------------------------------------


def languages(source: str, target: str) -> Part:
    return Part("languages", ["--source-lang", source, "--target-lang", target])


def sentencepiece(model: str) -> Part:
    """Raw text in and out of fairseq-interactive (and the hub): the sentencepiece ``model``
    applied to the input and removed from the output."""
    return Part("bpe", ["--bpe", "sentencepiece", "--sentencepiece-model", model])


def post_process(kind: str = "sentencepiece") -> Part:
    """fairseq-generate's ``--post-process KIND``: the ``D-`` lines detokenized."""
    return Part("post_process", ["--post-process", kind])


# ---------------------------------------------------------------------------------------------
# model sizes
# ---------------------------------------------------------------------------------------------


def width(spec: Spec, w: Optional[int]) -> Part:
    """The sizes of ``--width W`` by the family of ``spec`` (a resolved --arch:
    :meth:`~fairseq_deep.models.families.Spec.width`)."""
    return Part("size", spec.width(w))


def transformer_size(embed, ffn, heads) -> Part:
    """Both stacks' embedding width, FFN width and attention heads."""
    return Part(
        "size",
        [
            "--encoder-embed-dim",
            embed,
            "--decoder-embed-dim",
            embed,
            "--encoder-ffn-embed-dim",
            ffn,
            "--decoder-ffn-embed-dim",
            ffn,
            "--encoder-attention-heads",
            heads,
            "--decoder-attention-heads",
            heads,
        ],
    )


def hidden_size(encoder, decoder=None) -> Part:
    """The recurrent cells' sizes (``decoder``: the encoder's unless given)."""
    return Part(
        "size",
        [
            "--encoder-hidden-size",
            encoder,
            "--decoder-hidden-size",
            encoder if decoder is None else decoder,
        ],
    )


def rnn_size(embed, hidden, decoder_hidden=None) -> Part:
    """A recurrent model's embedding width and cells."""
    return Part(
        "size",
        [
            "--encoder-embed-dim",
            embed,
            "--decoder-embed-dim",
            embed,
            *hidden_size(hidden, decoder_hidden),
        ],
    )


def layers(encoder, decoder) -> Part:
    return Part("layers", ["--encoder-layers", encoder, "--decoder-layers", decoder])


def dropout(p, attention=None, activation=None) -> Part:
    """``--dropout p`` (and ``--attention-dropout``, ``--activation-dropout`` where given)."""
    words = ["--dropout", p]
    if attention is not None:
        words += ["--attention-dropout", attention]
    if activation is not None:
        words += ["--activation-dropout", activation]
    return Part("dropout", words)
