"""Named settings of fairseq runs, each written once: the optimisers and schedules of the papers
and of the study, the criterion, model sizes (a family's ``--width`` rule, explicit sizes, the
tests' tiny ones), device and precision, and json logging.  Each returns a
:class:`~fairseq_deep.runs.run.Part` (or a pair: optimiser, schedule) to compose into a
:class:`~fairseq_deep.runs.run.Run`."""

from typing import Dict, Optional, Sequence, Tuple

from ..models.families import Spec
from ..models.rnmt_plus.model import RNMT_LR_RATIO, RNMT_REPLICAS
from .run import Part

#: the warm-up's first learning rate of the inverse_sqrt schedule the study and the recipes use
#: (fairseq's own default is 0 unless --warmup-init-lr is given; Vaswani et al. start near 0)
WARMUP_INIT_LR = "1e-07"

# ---------------------------------------------------------------------------------------------
# optimisers and schedules
# ---------------------------------------------------------------------------------------------


def adam(lr=None, betas: Sequence[float] = (0.9, 0.98), eps: Optional[str] = None) -> Part:
    """fairseq's Adam: ``--optimizer adam --adam-betas '(b1, b2)' [--adam-eps E] [--lr LR]``
    (Vaswani et al. 2017 Sec. 5.3 use (0.9, 0.98); ``eps`` and ``lr`` as the command line writes
    them)."""
    words = ["--optimizer", "adam", "--adam-betas", f"({betas[0]}, {betas[1]})"]
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


def rnmt_plus(peak: float, warmup: int, replicas: int = 32) -> Tuple[Part, Part]:
    """RNMT+'s paper recipe (Chen et al. 2018 Sec. 4.1): Adam (0.9, 0.999, eps 1e-6) and Eq. 1
    with n = ``replicas``: from ``peak`` / n up to ``peak`` linearly over ``warmup`` updates (n p, p
    = warmup / n), then constant until the decay (``--lr-scheduler rnmt_plus``)."""
    return (
        adam(f"{peak:.6g}", (0.9, 0.999), eps="1e-6"),
        Part(
            "schedule",
            [
                "--lr-scheduler",
                "rnmt_plus",
                "--rnmt-replicas",
                replicas,
                "--rnmt-base-lr",
                f"{peak / replicas:.6g}",
                "--warmup-updates",
                max(1, round(warmup / replicas)),
            ],
        ),
    )


#: the papers' recipes that a family's declaration names (``Recipe.name``,
#: :mod:`fairseq_deep.models.families`): (the study's --lr, the Transformers' peak; --warmup) ->
#: (optimiser, schedule).  RNMT+ peaks at RNMT_LR_RATIO x --lr over n = RNMT_REPLICAS replicas.
PAPER = {
    "rnmt_plus": lambda lr, warmup: rnmt_plus(RNMT_LR_RATIO * lr, warmup, RNMT_REPLICAS),
}


def paper(name: str, lr, warmup) -> Tuple[Part, Part]:
    """The paper's recipe ``name`` (:data:`PAPER`) at the study's ``lr`` and ``warmup``."""
    return PAPER[name](lr, warmup)


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


def label_smoothed(smoothing=0.1) -> Part:
    """Label-smoothed cross-entropy (Szegedy et al. 2016; Vaswani et al. 2017 Sec. 5.4: 0.1)."""
    return Part(
        "criterion", ["--criterion", "label_smoothed_cross_entropy", "--label-smoothing", smoothing]
    )


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
