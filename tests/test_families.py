"""A model family is declared once (issue 39): ``fairseq_deep/models/families.py`` holds one
declaration per family, beside its model, and the tools and the test matrices read it.

* every --arch of the package is of a declared family (a model registered without a declaration
  fails here), and every family is a row of every test matrix it applies to (precision, both
  stacks and batch invariance, fully sharded wrapping, bf16 through the CLI, resume, grow,
  continue, checkpointed activations, export); a throwaway family declared here becomes a row of
  each, and the tools read it (its size rule, growth rule and reduction);
* what each family declares holds for its tiny models: they are of its model class and its
  presets, reduce to fairseq's transformer exactly (the fold an identity) or are refused in one
  line, and hold layer-weight matrices of the kinds it declares only; the study's groups train
  presets of exactly the families that name them.
"""

import pytest
import test_continue
import test_depth
import test_fully_sharded
import test_grow_families
import test_precision_cli
import test_resume
from fairseq.models import ARCH_MODEL_NAME_REGISTRY, ARCH_MODEL_REGISTRY
from helpers import build_model
from test_export import TOLERANCE, stock_of

from benchmarks import harness, precision_matrix
from fairseq_deep import runs
from fairseq_deep.diagnostics.layer_weights import extract_layer_weights
from fairseq_deep.models import families, reduction
from fairseq_deep.models.families import TINY_TRANSFORMER, Family, Tiny
from fairseq_deep.models.transformer_dlcl import TransformerDLCLModel
from fairseq_deep.modules import growth
from fairseq_deep.study.groups import GROUPS

TINY = {tiny.name: (family, tiny) for family, tiny in families.tiny_configs()}


def _family(arch: str) -> str:
    return families.of_arch(arch).name


def test_every_arch_of_the_package_is_of_a_declared_family():
    ours = [a for a, m in ARCH_MODEL_REGISTRY.items() if m.__module__.startswith("fairseq_deep.")]
    assert len(ours) > 100
    assert [a for a in ours if families.of_arch(a) is None] == []
    for family, tiny in families.tiny_configs():
        assert {tiny.arch, tiny.paper_arch} <= set(family.presets()), tiny.name
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


def test_every_matrix_has_a_row_of_every_family():
    every = {f.name for f in families.registered()}
    precision = precision_matrix.FAMILIES
    matrices = {
        "precision (test_precision, test_stacks)": (
            {_family(entry[1]) for entry in precision.values()},
            every,
        ),
        "fully sharded": (
            {_family(precision[n][1]) for n in test_fully_sharded.TRANSFORMER_FAMILIES},
            {f.name for f in families.registered() if f.transformer_layers},
        ),
        "bf16 through the CLI": (
            {_family(precision[n][1]) for n in test_precision_cli.BF16_FAMILIES},
            every,
        ),
        "resume": ({_family(row.values[0]) for row in test_resume.FAMILIES}, every),
        "grow": (
            {_family(row[0]) for row in test_grow_families.FAMILIES},
            {f.name for f in families.registered() if f.grows},
        ),
        "continue": (set(test_continue.FAMILIES), every),
        "checkpointed activations": (
            {_family(arch) for arch, _ in test_depth.FAMILIES},
            {f.name for f in families.registered() if f.kind == "transformer"},
        ),
        "export (test_each_tiny_configuration_is_what_its_family_declares)": (
            {family.name for family, _ in TINY.values()},
            every,
        ),
    }
    for name, (rows, wanted) in matrices.items():
        assert rows >= wanted, f"{name}: no row of {sorted(wanted - rows)}"
    assert precision_matrix.PAPER_MEMORY.keys() == precision.keys()


def test_a_throwaway_family_is_a_row_of_every_matrix_and_the_tools_read_it(monkeypatch):
    """Declared once: the matrices derive a row for it, and runs, grow and export read its rules."""
    monkeypatch.setattr(families, "_FAMILIES", dict(families._FAMILIES))
    monkeypatch.setattr(growth.FAMILIES, "declared", dict(growth.FAMILIES.declared))
    monkeypatch.setitem(ARCH_MODEL_NAME_REGISTRY, "throwaway_arch", "throwaway")

    class ThrowawayModel(TransformerDLCLModel):
        pass

    tiny = Tiny("throwaway_tiny", "throwaway_arch", "throwaway_arch", (1.0, 16, 0))
    family = families.declare(
        Family(
            name="throwaway",
            model=ThrowawayModel,
            kind="transformer",
            sizes=lambda width: ["--encoder-embed-dim", str(width)],
            reduction=reduction.never("a throwaway family"),
            tiny_sizes=TINY_TRANSFORMER,
            tiny=(tiny,),
        )
    )
    assert (family, tiny) in families.tiny_configs()
    assert (family, tiny) in families.matrix("bf16")
    rows = families.cover(
        [(t.arch, ()) for _, t in families.tiny_configs() if t is not tiny],
        arch=lambda row: row[0],
        default=lambda f, t: (t.name, f.name),
    )
    assert rows[-1] == ("throwaway_tiny", "throwaway")
    assert families.cover(
        [], arch=lambda row: row, default=lambda f, t: f.name, applies=lambda f: not f.grows
    ) == [f.name for f in families.registered() if not f.grows]
    assert runs.model_kind("throwaway_arch") == "transformer"
    assert runs.width_flags("throwaway_arch", 8) == ["--encoder-embed-dim", "8"]
    assert growth.family_rule(ThrowawayModel) is not None  # fairseq-deep-grow grows it
    assert reduction.why_not_transformer("throwaway", None) == "a throwaway family"
    with pytest.raises(ValueError, match="already declared"):
        families.declare(family)


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
