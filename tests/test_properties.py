"""Issue 7.6: deep stacks stay finite, and padding never leaks into real positions.

Property tests (hypothesis) on every deep architecture family at depth 30 (dimension 8): DLCL and
the plain pre-/post-norm Transformers, transparent attention, every layer aggregation and
multi-layer attention, RNMT+ (plain, DLCL, transparent) and Deep-Att/Deep-ED.  For random
initialisation seeds, batch sizes, sentence lengths (1 included) and heavy padding,

* the forward pass and the gradients of all parameters are finite at initialisation;
* the output at each real position of a padded batch equals the output of that sentence run
  alone, without padding (sources are left-padded and targets right-padded, as fairseq does).

Also a property of the batching shim: ``fairseq.data.data_utils.batch_by_size`` (patched by
fairseq_deep) returns every index exactly once, for any batch settings.

A family that none of DEEP_ARCHS is of is a row at its first tiny configuration (its tiny sizes,
30 encoder layers: ``families.cover``); a row of its own, at dimension 8, is its depth-30 arch (and
the flags it needs) in DEEP_ARCHS, and its sizes in ``dims8`` when it is not a Transformer.
"""

import numpy as np
import pytest
import torch
from fairseq.data import data_utils
from helpers import build_model, tiny_dictionary
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from fairseq_deep.models import families

DEPTH30 = ["--encoder-layers", "30"]

_DEEP_ARCHS = [
    ("transformer_dlcl_30l", []),
    ("transformer_dlcl_postnorm_30l", []),
    ("transformer_prenorm_30l", []),
    ("transformer_postnorm_30l", []),
    ("transformer_ta", DEPTH30),
    ("transformer_ta_prenorm", DEPTH30),
    ("transformer_dense", DEPTH30),
    ("transformer_linear_agg", DEPTH30),
    ("transformer_iterative_agg", DEPTH30),
    ("transformer_hier_agg", DEPTH30),
    ("transformer_mla2", DEPTH30),
    ("transformer_deepnorm", DEPTH30),
    ("transformer_admin", DEPTH30),
    (
        "transformer_rezero",
        [*DEPTH30, "--rezero-init", "0.5"],
    ),  # alpha = 0 would make every layer the identity
    ("transformer_dsinit", DEPTH30),
    ("rnmt_plus", DEPTH30),
    ("rnmt_plus", [*DEPTH30, "--dlcl-stacks", "both"]),
    ("rnmt_plus", [*DEPTH30, "--rnmt-transparent"]),
    ("deep_att_ff", DEPTH30),
    ("deep_ed_ff", DEPTH30),
]


def deep_archs():
    """The rows above, and one of every family that none of them is of: its first tiny
    configuration with 30 encoder layers (models/families.py)."""
    return families.cover(
        _DEEP_ARCHS,
        arch=lambda row: row[0],
        default=lambda family, tiny: (tiny.arch, [*family.tiny_sizes, *tiny.model, *DEPTH30]),
    )


DEEP_ARCHS = deep_archs()

DIM8 = [
    "--encoder-embed-dim",
    "8",
    "--decoder-embed-dim",
    "8",
    "--encoder-ffn-embed-dim",
    "16",
    "--decoder-ffn-embed-dim",
    "16",
    "--encoder-attention-heads",
    "2",
    "--decoder-attention-heads",
    "2",
    "--decoder-layers",
    "6",
]


def dims8(arch):
    """Dimension-8 sizes of the arch's family (6 decoder layers)."""
    if arch.startswith("rnmt_plus"):
        return [
            "--encoder-embed-dim",
            "8",
            "--decoder-embed-dim",
            "8",
            "--encoder-hidden-size",
            "8",
            "--decoder-hidden-size",
            "8",
            "--rnmt-attention-heads",
            "2",
            "--decoder-layers",
            "6",
        ]
    if arch.startswith(("deep_att", "deep_ed")):
        return [
            "--encoder-embed-dim",
            "8",
            "--decoder-embed-dim",
            "8",
            "--encoder-hidden-size",
            "8",
            "--decoder-hidden-size",
            "8",
            "--decoder-layers",
            "6",
        ]
    return DIM8


def encoder_layers(model):
    """The encoder's layers (Deep-Att: those of its first column)."""
    if hasattr(model.encoder, "columns"):
        return model.encoder.columns[0].layers
    return model.encoder.layers


def arch_id(arch, flags):
    return "-".join(
        [arch, *(f.lstrip("-") for f in flags if f.startswith("--") and f != "--encoder-layers")]
    )


DICT = tiny_dictionary(12)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny deep models are dominated by thread start-up on a shared 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@st.composite
def padded_batches(draw):
    """A batch of 1-3 sentence pairs of lengths 1..10 (EOS included) and the seed of the model."""
    seed = draw(st.integers(0, 2**16))
    bsz = draw(st.integers(1, 3))
    src_lens = draw(st.lists(st.integers(1, 10), min_size=bsz, max_size=bsz))
    tgt_lens = draw(st.lists(st.integers(1, 8), min_size=bsz, max_size=bsz))
    return make_batch(seed, src_lens, tgt_lens)


def make_batch(seed, src_lens, tgt_lens):
    g = torch.Generator().manual_seed(seed)
    lo, hi = DICT.nspecial, len(DICT)
    srcs = [
        torch.cat([torch.randint(lo, hi, (n - 1,), generator=g), torch.tensor([DICT.eos()])])
        for n in src_lens
    ]
    prevs = [
        torch.cat([torch.tensor([DICT.eos()]), torch.randint(lo, hi, (n - 1,), generator=g)])
        for n in tgt_lens
    ]
    return seed, srcs, prevs


def collate(srcs, prevs):
    S, T = max(len(s) for s in srcs), max(len(p) for p in prevs)
    src = torch.full((len(srcs), S), DICT.pad())
    prev = torch.full((len(prevs), T), DICT.pad())
    for i, (s, p) in enumerate(zip(srcs, prevs)):
        src[i, S - len(s) :] = s  # left-padded source
        prev[i, : len(p)] = p  # right-padded target
    return src, torch.tensor([len(s) for s in srcs]), prev


@pytest.mark.parametrize("arch,flags", DEEP_ARCHS, ids=[arch_id(a, f) for a, f in DEEP_ARCHS])
def test_depth_30_is_finite_and_padding_free(arch, flags):
    @settings(
        max_examples=8,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(padded_batches())
    @example(make_batch(1, [1], [1]))  # a lone EOS in, a lone BOS out
    @example(make_batch(2, [1, 10, 3], [8, 1, 2]))  # heavy padding on both sides
    def check(example):
        seed, srcs, prevs = example
        model, _ = build_model(arch, [*dims8(arch), *flags], dictionary=DICT, seed=seed)
        assert len(encoder_layers(model)) == 30
        src, lengths, prev = collate(srcs, prevs)
        logits, _ = model(src, lengths, prev)
        assert torch.isfinite(logits).all()
        real = prev.ne(DICT.pad())
        (logits.log_softmax(-1)[real].sum()).backward()
        for name, p in model.named_parameters():
            if p.grad is not None:
                assert torch.isfinite(p.grad).all(), name
        assert all(p.grad is not None for p in encoder_layers(model)[0].parameters())

        with torch.no_grad():
            for i, (s, p) in enumerate(zip(srcs, prevs)):
                alone, _ = model(s[None], torch.tensor([len(s)]), p[None])
                torch.testing.assert_close(logits[i, : len(p)], alone[0], rtol=1e-4, atol=1e-4)

    check()


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=120),
    max_sentences=st.one_of(st.none(), st.integers(1, 20)),
    max_tokens=st.one_of(st.none(), st.integers(40, 300)),
    multiple=st.sampled_from([1, 2, 3, 8, 16]),
)
def test_batch_by_size_returns_every_index_once(sizes, max_sentences, max_tokens, multiple):
    sizes = np.array(sizes, dtype=np.int64)
    indices = np.argsort(sizes, kind="mergesort")
    batches = data_utils.batch_by_size(
        indices,
        lambda i: sizes[i],
        num_tokens_vec=sizes[indices] if multiple % 2 else None,
        max_tokens=max_tokens,
        max_sentences=max_sentences,
        required_batch_size_multiple=multiple,
    )
    flat = np.concatenate(batches)
    assert sorted(flat.tolist()) == list(range(len(sizes)))
    for b in batches:
        if max_sentences is not None:
            assert len(b) <= max_sentences
        if max_tokens is not None and len(b) > 1:
            assert len(b) * sizes[b].max() <= max_tokens
