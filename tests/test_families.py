"""A model family is declared once (issue 39): ``fairseq_deep/models/families.py`` holds one
declaration per family, beside its model, and the tools and the test matrices read it.

* every --arch of the package is of a declared family (a model registered without a declaration
  fails here), and every family is a row of every test matrix it applies to (precision, both
  stacks and batch invariance, fully sharded wrapping, bf16 through the CLI, resume, grow,
  continue, checkpointed activations, depth 30, export, list-archs, and the fingerprint's cases,
  kept by hand); a family is done when it is declared (issue 45): a throwaway pre-norm variant
  of transformer_dlcl declared here is a row of each matrix but the by-hand one, which the suite
  then fails on, and the tools read it (the study's sizes and recipe, grow, export, list-archs);
* what each family declares holds for its tiny models: they are of its model class and its
  presets, reduce to fairseq's transformer exactly (the fold an identity) or are refused in one
  line, and hold layer-weight matrices of the kinds it declares only; the study's groups train
  presets of exactly the families that name them.
"""

import argparse

import pytest
import test_continue
import test_depth
import test_export
import test_fully_sharded
import test_grow
import test_grow_families
import test_properties
import test_resume
import test_stacks
from fairseq.models import (
    ARCH_CONFIG_REGISTRY,
    ARCH_MODEL_INV_REGISTRY,
    ARCH_MODEL_NAME_REGISTRY,
    ARCH_MODEL_REGISTRY,
    MODEL_REGISTRY,
)
from helpers import build_family, build_model
from test_export import TOLERANCE, stock_of

from benchmarks import harness, precision_matrix, refactor_fingerprint
from fairseq_deep import list_archs, runs
from fairseq_deep.diagnostics.layer_weights import extract_layer_weights
from fairseq_deep.grow import depth_options
from fairseq_deep.models import families, reduction
from fairseq_deep.models.families import TINY_TRANSFORMER, Family, PaperScale, Tiny
from fairseq_deep.models.transformer_dlcl import TransformerDLCLModel
from fairseq_deep.study.commands import recipe
from fairseq_deep.study.groups import GROUPS
from fairseq_deep.study.systems import parse_system

TINY = {tiny.name: (family, tiny) for family, tiny in families.tiny_configs()}


def _family(arch: str) -> str:
    return families.of_arch(arch).name


def test_every_arch_of_the_package_is_of_a_declared_family():
    ours = [a for a, m in ARCH_MODEL_REGISTRY.items() if m.__module__.startswith("fairseq_deep.")]
    assert len(ours) > 100
    assert [a for a in ours if families.of_arch(a) is None] == []
    for family, tiny in families.tiny_configs():
        assert {tiny.arch, tiny.paper.arch} <= set(family.presets()), tiny.name
    assert families.of_arch("transformer") is None  # fairseq's own


def _widths(flags):
    """``{option: value}`` of a flag list, without its depths and dropouts."""
    pairs = dict(zip(flags[::2], flags[1::2]))
    return {k: v for k, v in pairs.items() if "layers" not in k and "dropout" not in k}


@pytest.mark.parametrize(
    "sizes,family",
    [("TINY", "transformer_dlcl"), ("TINY_RNMT", "rnmt_plus"), ("TINY_DEEP_ATT", "deep_att")],
)
def test_the_harness_tiny_sizes_are_the_declared_ones(sizes, family):
    """benchmarks/harness.py writes the tiny widths out (refactor_fingerprint builds two versions
    of the package with them); they are the family declarations' own."""
    widths = _widths(families.get(family).tiny_sizes)
    assert len(widths) >= 4 and _widths(getattr(harness, sizes)) == widths


def matrices():
    """{matrix: (the families its rows are of, the families it must have a row of)}, every matrix's
    rows computed now by the function its test parametrizes with, so that a family declared after
    the test modules were imported counts as one declared before."""
    every = {f.name for f in families.registered()}
    transformer_layers = {f.name for f in families.registered() if f.transformer_layers}
    grows = {f.name for f in families.registered() if f.grows}
    precision = precision_matrix.rows()

    def named(names):
        return {_family(precision[name][1]) for name in names}

    return {
        "precision (test_precision, test_stacks)": (named(precision), every),
        "batch invariance (test_stacks)": (named(test_stacks.post_norm()), transformer_layers),
        "fully sharded": (named(test_fully_sharded.transformer_families()), transformer_layers),
        "bf16 through the CLI": ({f.name for f, _ in families.matrix("bf16")}, every),
        "resume": ({_family(row.values[0]) for row in test_resume.rows()}, every),
        "grow (test_grow_families)": (
            {_family(row[0]) for row in test_grow_families.rows()},
            grows,
        ),
        "grow to the same depth (test_grow)": ({_family(a) for a, _ in test_grow.same()}, grows),
        "continue": (set(test_continue.rows()), every),
        "checkpointed activations": (
            {_family(arch) for arch, _ in test_depth.rows()},
            {f.name for f in families.registered() if f.kind == "transformer"},
        ),
        "depth 30 (test_properties)": (
            {_family(a) for a, _ in test_properties.deep_archs()},
            every,
        ),
        "export: reduced or refused (test_export)": (
            {_family(row[0]) for row in test_export.reducible() + test_export.refused()},
            every,
        ),
        "export: each tiny configuration (below)": (
            {family.name for family, _ in families.tiny_configs()},
            every,
        ),
        "fairseq-deep-list-archs": (set(list_archs.our_architectures()), every),
        # kept by hand: the fingerprint of an older version must have the same rows
        "refactor_fingerprint (by hand)": (
            {_family(arch) for arch, _ in refactor_fingerprint.cases()},
            every,
        ),
    }


def missing_rows():
    """{matrix: the families it must have a row of and has none of}."""
    found = {name: wanted - rows for name, (rows, wanted) in matrices().items()}
    return {name: missing for name, missing in found.items() if missing}


def test_every_matrix_has_a_row_of_every_family():
    assert missing_rows() == {}
    assert precision_matrix.PAPER_MEMORY.keys() == precision_matrix.FAMILIES.keys()


class ThrowawayModel(TransformerDLCLModel):
    """A throwaway pre-norm variant of transformer_dlcl, declared by a test."""


#: its tiny configuration
THROWAWAY = Tiny("throwaway_tiny", "throwaway_prenorm", PaperScale("throwaway_prenorm", (1, 16, 0)))


def declare_throwaway(monkeypatch):
    """A model ``throwaway`` (a subclass of transformer_dlcl's) with one preset,
    ``throwaway_prenorm`` (transformer_prenorm's), in fairseq's registries, and its family declared;
    ``monkeypatch`` takes both away when it is undone."""
    monkeypatch.setattr(families, "_FAMILIES", dict(families._FAMILIES))
    preset = ARCH_CONFIG_REGISTRY["transformer_prenorm"]
    monkeypatch.setitem(MODEL_REGISTRY, "throwaway", ThrowawayModel)
    monkeypatch.setitem(ARCH_MODEL_REGISTRY, "throwaway_prenorm", ThrowawayModel)
    monkeypatch.setitem(ARCH_MODEL_NAME_REGISTRY, "throwaway_prenorm", "throwaway")
    monkeypatch.setitem(ARCH_MODEL_INV_REGISTRY, "throwaway", ["throwaway_prenorm"])
    monkeypatch.setitem(ARCH_CONFIG_REGISTRY, "throwaway_prenorm", preset)
    return families.declare(
        Family(
            name="throwaway",
            model=ThrowawayModel,
            kind="transformer",
            transformer_layers=True,
            sizes=families.transformer_sizes,
            reduction=reduction.residual_stacks,
            tiny_sizes=TINY_TRANSFORMER,
            tiny=(THROWAWAY,),
        )
    )


def test_a_family_is_done_when_it_is_declared():
    """Issue 45: a throwaway family, declared and nothing else, is a row of every matrix (the
    by-hand fingerprint's cases aside, which the suite then fails on) and the tools read it; once
    it is taken away, nothing of it is left."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        _check_the_throwaway(declare_throwaway(monkeypatch))
    assert "throwaway_prenorm" not in ARCH_MODEL_NAME_REGISTRY and families.get("throwaway") is None
    assert missing_rows() == {}


def _check_the_throwaway(throwaway):
    assert missing_rows() == {"refactor_fingerprint (by hand)": {"throwaway"}}
    assert families.spec("throwaway_prenorm").family is throwaway
    # its rows: the precision matrix's entry builds a model of its class, which reduces exactly
    entry = precision_matrix.rows()["throwaway_tiny"]
    assert entry[:3] == ("throwaway_prenorm", "throwaway_prenorm", list(TINY_TRANSFORMER))
    model, _ = build_family(entry)
    assert isinstance(model, ThrowawayModel)
    assert reduction.why_not_transformer("throwaway", model) is None
    assert ("throwaway_prenorm", [*TINY_TRANSFORMER]) in test_export.reducible()
    assert stock_of("throwaway_prenorm", list(TINY_TRANSFORMER))[3] == 0  # nothing folded
    # the study's sizes and recipe, list-archs, grow
    spec = families.spec("throwaway_prenorm")
    assert spec.width(64) == families.transformer_sizes(64) == runs.width_flags(spec.arch, 64)
    assert (spec.kind, spec.recipe, spec.depths) == ("transformer", None, (6, 6))
    system = parse_system("t=throwaway_prenorm")
    args = argparse.Namespace(width=64, lr=1e-3, warmup=100, recipe="paper")
    assert system.spec == spec and recipe(args, system.spec)[0] == "shared"
    assert [f.name for f, _ in families.tiny_configs()].count("throwaway") == 1
    assert list_archs.our_architectures()["throwaway"][0][0] == "throwaway_prenorm"
    assert depth_options("throwaway", argparse.Namespace()) == ("encoder_layers", "decoder_layers")
    with pytest.raises(ValueError, match="already declared"):
        families.declare(throwaway)


@pytest.mark.parametrize("name", list(TINY))
def test_each_tiny_configuration_is_what_its_family_declares(name):
    """Its model is of the family's class; it reduces to fairseq's transformer with a fold that is
    an identity, or it is refused in one line; its layer-weight matrices are of declared kinds."""
    family, tiny = TINY[name]
    flags = [*family.tiny_sizes, *tiny.model]
    model, _ = build_model(tiny.arch, flags)
    assert isinstance(model, family.model)
    why = reduction.why_not_transformer(family.name, model)
    if why is None:
        assert stock_of(tiny.arch, flags)[3] < TOLERANCE
    else:
        assert why.strip() and "\n" not in why, why
    held = {record["kind"] for record in extract_layer_weights(model.state_dict())}
    assert held <= {kind.name for kind in family.layer_weights}


def test_the_study_groups_train_presets_of_the_families_that_name_them():
    for name, group in GROUPS.items():
        systems = group.spec.systems(name, None)[1]
        assert {_family(s.arch) for s in systems} == {
            f.name for f in families.registered() if name in f.study
        }, name
