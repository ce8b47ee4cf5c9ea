"""The papers' claims that the built-in groups test, as data: each a system of a group that its
paper says is better (or worse) than another system of the group, with the paper's words and
numbers (:data:`CLAIMS`), and :func:`judge`, which says whether a study's scores bear a claim out
(the ledger of the GPU windows and docs/study.md's "At Base width on a GPU", issue 38).

A claim compares BLEU on the test set: ``above`` holds where the system scores higher than the one
it is compared with, ``below`` where it scores lower (or its training diverged: the papers'
"failed to train"), ``not_below`` where it is not significantly lower (the papers' "marginal"
gains); against the group's baseline the difference must be significant (sacreBLEU's paired
bootstrap, p < :data:`ALPHA`), against another system the paired test of the two is used where
the ledger holds it."""

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

#: the significance level of a claim against the baseline (paired bootstrap, one-sided reading of
#: sacreBLEU's p-value: the difference must also have the claimed sign)
ALPHA = 0.05

#: a training run that stopped on one of these diverged (fairseq's fp16 loss scaler at its
#: minimum, non-finite gradients: its FloatingPointError): the papers' "failed to train"
DIVERGED = ("Minimum loss scale reached", "loss is probably exploding", "FloatingPointError")


@dataclass(frozen=True)
class Claim:
    """``system`` of ``group`` is ``direction`` (above, below, not_below) ``than`` (None: the
    group's baseline), as ``paper`` says (its words, with the table and numbers it reports)."""

    group: str
    system: str
    direction: str
    paper: str
    than: Optional[str] = None


_WANG = "Wang et al. 2019"
_BAPNA = "Bapna et al. 2018"

CLAIMS: Tuple[Claim, ...] = (
    Claim(
        "wang",
        "postnorm_30",
        "below",
        f"{_WANG}, Table 1: a post-norm Transformer with a deep encoder fails to train "
        "(20 layers: 'failed'; 6 layers: 27.5 BLEU)",
    ),
    Claim(
        "wang",
        "prenorm_30",
        "above",
        f"{_WANG}, Table 1: a deep pre-norm encoder beats the 6-layer baseline "
        "(20 layers: 28.9 against 27.5)",
    ),
    Claim(
        "wang",
        "dlcl_30",
        "above",
        f"{_WANG}, Table 1: pre-norm DLCL with a 30-layer encoder beats the 6-layer baseline "
        "(29.3 against 27.5)",
    ),
    Claim(
        "wang",
        "dlcl_30",
        "above",
        f"{_WANG}, Table 1 and Sec. 5.1: DLCL beats pre-norm at depth (30-layer DLCL 29.3, the "
        "best pre-norm 28.9 at 20 layers; pre-norm degenerates beyond 20)",
        than="prenorm_30",
    ),
    Claim(
        "depth",
        "postnorm_18",
        "below",
        "Liu et al. 2020 (Admin), Table 1: post-norm diverges at 18 + 18 layers on WMT'14 En-De",
    ),
    Claim(
        "depth",
        "prenorm_18",
        "above",
        f"{_WANG} and Liu et al. 2020: pre-norm trains at depth and the deeper model is better",
    ),
    Claim(
        "depth",
        "dlcl_18",
        "above",
        f"{_WANG}: DLCL trains deep models that beat the 6-layer baseline",
    ),
    Claim(
        "depth",
        "deepnorm_18",
        "above",
        "Wang et al. 2022 (DeepNet), Table 1: DeepNorm trains deep post-norm models stably, deeper "
        "is better",
    ),
    Claim(
        "depth",
        "admin_18",
        "above",
        "Liu et al. 2020 (Admin), Table 1: Admin trains 18 + 18 layers where post-norm diverges, "
        "and beats 6 + 6",
    ),
    Claim(
        "depth",
        "dsinit_18",
        "above",
        "Zhang et al. 2019 (DS-Init): depth-scaled initialisation lets deeper Transformers beat "
        "the 6-layer baseline",
    ),
    Claim(
        "depth",
        "rezero_18",
        "above",
        "Bachlechner et al. 2020 (ReZero): ReZero converges where post-norm does not (shown on "
        "deep language models; its translation run is 6 + 6)",
        than="postnorm_18",
    ),
    Claim(
        "bapna",
        "baseline_16",
        "below",
        f"{_BAPNA}, Table 1: the post-norm baseline with a 16-layer encoder fails to train "
        "(6 layers: 27.26)",
    ),
    Claim(
        "bapna",
        "nores_16",
        "below",
        f"{_BAPNA}, Table 1: without encoder residuals a 16-layer encoder fails to train",
    ),
    Claim(
        "bapna",
        "ta_16",
        "above",
        f"{_BAPNA}, Table 1: transparent attention trains a 16-layer encoder that beats the "
        "6-layer baseline (28.04 against 27.26)",
    ),
    Claim(
        "dou",
        "dense",
        "not_below",
        "Dou et al. 2018, Table 1: dense connections improve on the baseline only marginally",
    ),
    Claim(
        "dou",
        "linear",
        "not_below",
        "Dou et al. 2018, Table 1: linear combination improves on the baseline only marginally",
    ),
    Claim(
        "dou",
        "iterative",
        "above",
        "Dou et al. 2018, Table 1: iterative aggregation beats the baseline (up to +0.99 BLEU)",
    ),
    Claim(
        "dou",
        "hierarchical",
        "above",
        "Dou et al. 2018, Table 1: hierarchical aggregation beats the baseline (up to +0.99 BLEU)",
    ),
    Claim(
        "dou",
        "mla2",
        "above",
        "Dou et al. 2018, Table 1: multi-layer attention (k = 2) significantly beats the baseline",
    ),
    Claim(
        "dou",
        "hierarchical+div",
        "above",
        "Dou et al. 2018, Table 1: the layer-diversity regularizer adds to hierarchical aggregation",
        than="hierarchical",
    ),
    Claim(
        "chen",
        "rnmt_plus",
        "above",
        "Chen et al. 2018, Table 2: RNMT+ beats the Transformer on WMT'14 En-De (28.49 against "
        "Base 27.26)",
    ),
    Claim(
        "chen",
        "hybrid_transformer_rnmt",
        "above",
        "Chen et al. 2018, Table 5: a Transformer encoder with an RNMT+ decoder beats the "
        "Transformer (En-Fr 41.12 against 40.73)",
    ),
    Claim(
        "chen",
        "hybrid_rnmt_transformer",
        "below",
        "Chen et al. 2018, Table 5: an RNMT+ encoder with a Transformer decoder is below the "
        "Transformer (En-Fr 39.92 against 40.73)",
    ),
    Claim(
        "chen",
        "hybrid_cascaded",
        "above",
        "Chen et al. 2018, Table 6: the cascaded encoder beats the Transformer (En-De 28.62 "
        "against 27.94)",
    ),
    Claim(
        "chen",
        "hybrid_multicolumn",
        "above",
        "Chen et al. 2018, Table 6: the multi-column encoder beats the Transformer (En-De 28.84 "
        "against 27.94)",
    ),
    Claim(
        "zhou",
        "ff_2x2",
        "above",
        "Zhou et al. 2016, Table 2: fast-forward connections improve Deep-Att at 2 + 2 layers "
        "(34.7 against 33.3, En-Fr)",
    ),
    Claim(
        "zhou",
        "ff_5x3",
        "above",
        "Zhou et al. 2016, Table 5: with F-F connections the deeper model is better (5/3 layers "
        "36.0 against 2/2 34.7)",
        than="ff_2x2",
    ),
    Claim(
        "zhou",
        "noff_5x3",
        "below",
        "Zhou et al. 2016, Sec. 4.4: without F-F connections a deeper model could not be trained "
        "(parameter explosion)",
    ),
    Claim(
        "li",
        "dlcl_6_12",
        "not_below",
        "Li et al. 2020: a deep model grown from a shallow one reaches the quality of the same "
        "depth trained from scratch, faster (here: in equal time)",
    ),
    Claim(
        "li",
        "dlcl_6",
        "below",
        "Li et al. 2020 and Wang et al. 2019: the deeper DLCL (12 layers) beats the shallow one",
    ),
    # The modern group, at each shape of the GPU plan (18 + 18, 48 + 6; each shape's baseline is
    # pre-norm of that shape): each scheme's paper's claim against pre-norm for translation
    # (docs/deep_schemes.md). None is declared where the paper makes no such claim: Sub-LN
    # (Magneto) compares with the variant each field uses, post-norm for translation; Peri-LN,
    # Mix-LN, DenseFormer, hyper-connections and mHC report language models only, DyT and
    # LayerScale vision, speech and language models (DyT: matching layer norm, not beating it);
    # the ODE Transformer's translation results are RK2's (RK4 is reported beating the residual
    # block on summarisation and grammatical error correction, the authors' README).
    Claim(
        "modern",
        "dlcl_18+18",
        "not_below",
        f"{_WANG}, Table 2: with a 16-layer encoder pre-norm DLCL is only marginally above "
        "pre-norm (28.2 against 28.0); the gap opens beyond 20 layers (Sec. 6.1; the paper "
        "deepens the encoder only)",
    ),
    Claim(
        "modern",
        "dlcl_48+6",
        "above",
        f"{_WANG}, Table 1 and Sec. 6.1: with a deep encoder over 6 decoder layers DLCL beats "
        "pre-norm (30 layers: 29.3; the best pre-norm 28.9 at 20); pre-norm degenerates beyond "
        "20 layers and is less robust than DLCL",
    ),
    Claim(
        "modern",
        "deepnorm_18+18",
        "above",
        "Wang et al. 2022 (DeepNet), abstract and Table 1 (WMT-17 En-De, 6L-6L to 100L-100L): "
        "DeepNorm combines post-norm's performance with pre-norm's stable training, above "
        "pre-norm at equal depth",
    ),
    Claim(
        "modern",
        "deepnorm_48+6",
        "above",
        "Wang et al. 2022 (DeepNet), abstract and Table 1: DeepNorm combines post-norm's "
        "performance with pre-norm's stable training, above pre-norm at equal depth (the paper "
        "deepens both stacks; here a 48-layer encoder)",
    ),
    Claim(
        "modern",
        "b2t_18+18",
        "above",
        "Takase et al. 2023 (B2T), abstract: on text generation tasks, WMT En-De among them "
        "(6L-6L, 18L-18L, 100L-100L), post-norm with B2T outperforms pre-norm and trains stably "
        "whether shallow or deep",
    ),
    Claim(
        "modern",
        "b2t_48+6",
        "above",
        "Takase et al. 2023 (B2T), abstract: post-norm with B2T outperforms pre-norm and trains "
        "stably whether shallow or deep (the paper deepens both stacks; here a 48-layer encoder)",
    ),
    Claim(
        "modern",
        "resi_dual_18+18",
        "above",
        "Xie et al. 2023 (ResiDual), abstract: ResiDual outperforms both post-norm and pre-norm "
        "on several translation benchmarks across network depths and data sizes (IWSLT, WMT; "
        "OPUS at 18 + 18)",
    ),
    Claim(
        "modern",
        "resi_dual_48+6",
        "above",
        "Xie et al. 2023 (ResiDual), abstract: ResiDual outperforms both post-norm and pre-norm "
        "on several translation benchmarks across network depths (the paper deepens both "
        "stacks; here a 48-layer encoder)",
    ),
    Claim(
        "modern",
        "ode_rk2_18+18",
        "above",
        "Li et al. 2022 (ODE Transformer), abstract and the authors' README: RK2 blocks with "
        "learned coefficients in the encoder beat the residual (pre-norm) baseline on WMT'14 "
        "En-De (Big, 6-6: 30.53 against 29.21)",
    ),
    Claim(
        "modern",
        "ode_rk2_48+6",
        "above",
        "Li et al. 2022 (ODE Transformer), abstract and the authors' README: RK2 blocks with "
        "learned coefficients in a deep encoder beat the residual (pre-norm) baseline on WMT'14 "
        "En-De (Big, 12-6: 30.76 against 29.91)",
    ),
)

#: the modern group's schemes whose papers make no claim against pre-norm for translation (the
#: comment above :data:`CLAIMS`' modern claims says why): no claim of theirs is judged
NO_CLAIM_AGAINST_PRENORM = (
    "subln",
    "periln",
    "mixln",
    "dyt",
    "layerscale",
    "denseformer",
    "hc",
    "mhc",
    "ode_rk4",
)


def of_group(group: str) -> List[Claim]:
    """The claims that ``group`` tests, in order."""
    return [c for c in CLAIMS if c.group == group]


def diverged(error: Optional[str]) -> bool:
    """Whether a failed training's error line says it diverged (:data:`DIVERGED`)."""
    return bool(error) and any(mark in error for mark in DIVERGED)


def judge(claim: Claim, system: Dict, other: Dict, p: Optional[float]) -> Tuple[str, str]:
    """(verdict, why) of ``claim`` from the ledger's entries of its system and of the one it is
    compared with (``{"bleu": ...}``, or ``{"error": ...}`` for a failed run) and the p-value of
    their paired bootstrap (None: no paired test of the two): "holds", "does not hold" or
    "not yet run" (a comparison that cannot be made)."""
    if "bleu" not in other:
        return "not yet run", f"the system compared with has no score ({other.get('error', '?')})"
    if "bleu" not in system:
        if claim.direction == "below" and diverged(system.get("error")):
            return "holds", "training diverged"
        return "not yet run", f"no score ({system.get('error', '?')})"
    diff = system["bleu"] - other["bleu"]
    significant = p is not None and p < ALPHA
    test = f"p = {p:.3f}" if p is not None else "no paired test"
    if claim.direction == "not_below":
        ok = diff >= 0 or not significant
    else:
        ok = (diff > 0 if claim.direction == "above" else diff < 0) and (p is None or significant)
    return ("holds" if ok else "does not hold"), f"{diff:+.2f} BLEU, {test}"
