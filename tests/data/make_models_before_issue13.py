"""Makes tests/data/models_before_issue13.json: for tiny models of every family, built by the code
before issue 13's refactoring, the names and shapes of every state-dict entry and the logits on a
fixed batch after :func:`fill_parameters` (weights drawn from each parameter's *name*, so that the current
code can rebuild the same weights without a stored checkpoint).  Run against that code, with
that checkout and its tests/ (``helpers``) on ``PYTHONPATH``, e.g.

    git worktree add /tmp/old d76da91 && cd /tmp/old && \
    PYTHONPATH=/tmp/old:/tmp/old/tests python /path/to/make_models_before_issue13.py OUT.json
"""

import json
import sys
import zlib

import torch
from fairseq import options, tasks
from helpers import random_batch, tiny_dictionary

import fairseq_deep  # noqa

T = [
    "--encoder-embed-dim",
    "4",
    "--decoder-embed-dim",
    "4",
    "--encoder-ffn-embed-dim",
    "8",
    "--decoder-ffn-embed-dim",
    "8",
    "--encoder-attention-heads",
    "2",
    "--decoder-attention-heads",
    "2",
    "--encoder-layers",
    "2",
    "--decoder-layers",
    "2",
    "--dropout",
    "0",
]
R = [
    "--encoder-embed-dim",
    "4",
    "--decoder-embed-dim",
    "4",
    "--encoder-hidden-size",
    "4",
    "--decoder-hidden-size",
    "4",
    "--rnmt-attention-heads",
    "2",
    "--encoder-layers",
    "3",
    "--decoder-layers",
    "3",
    "--dropout",
    "0",
]
H = [
    *T,
    "--encoder-hidden-size",
    "4",
    "--decoder-hidden-size",
    "4",
    "--rnmt-attention-heads",
    "2",
    "--rnmt-encoder-layers",
    "2",
]
D = [
    "--encoder-embed-dim",
    "4",
    "--decoder-embed-dim",
    "4",
    "--encoder-hidden-size",
    "4",
    "--decoder-hidden-size",
    "4",
    "--encoder-layers",
    "2",
    "--decoder-layers",
    "2",
    "--dropout",
    "0",
]
MODELS = {
    "transformer_dlcl": T,
    "transformer_dlcl_postnorm": [*T, "--dlcl-softmax-weights"],
    "transformer_ta": T,
    "transformer_dense": T,
    "transformer_linear_agg": T,
    "transformer_iterative_agg": T,
    "transformer_hier_agg": [*T, "--encoder-layers", "3"],
    "transformer_mla2": T,
    "rnmt_plus": [*R, "--dlcl-stacks", "both"],
    "rnmt_plus_512_ta": [*R, "--encoder-layers", "6"],
    "hybrid_transformer_rnmt": H,
    "hybrid_cascaded": H,
    "hybrid_multicolumn": H,
    "deep_att_ff": D,
    "deep_ed_ff": D,
}


def fill_parameters(model):
    """Every parameter drawn from N(0, 0.3^2) by a generator seeded with its name (buffers such as
    ``version`` keep their values)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
            p.copy_(0.3 * torch.randn(p.shape, generator=g))


if __name__ == "__main__":
    d = tiny_dictionary()
    src, lengths, prev = random_batch(d)
    out = {"src": src.tolist(), "lengths": lengths.tolist(), "prev": prev.tolist(), "models": {}}
    for arch, flags in MODELS.items():
        parser = options.get_training_parser()
        args = options.parse_args_and_arch(
            parser, ["dummy-data", "--task", "translation", "--arch", arch, "--cpu", *flags]
        )
        model = tasks.translation.TranslationTask(args, d, d).build_model(args).eval()
        fill_parameters(model)
        state = model.state_dict()
        params = {name for name, _ in model.named_parameters()}
        with torch.no_grad():
            logits, _ = model(src, lengths, prev)
        out["models"][arch] = {
            "flags": list(flags),
            # parameters: dtype and shape (their values come from fill_parameters); buffers: values too
            "entries": {
                k: [str(v.dtype), list(v.shape), None if k in params else v.tolist()]
                for k, v in state.items()
            },
            # float32's shortest decimal for each logit: read back as float32, exactly the value
            "logits": [float(str(x)) for x in logits.reshape(-1).numpy()],
            "logits_shape": list(logits.shape),
        }
    with open(sys.argv[1], "w") as f:
        json.dump(out, f)
    print(
        sum(
            torch.Size(e[1]).numel() for m in out["models"].values() for e in m["entries"].values()
        ),
        "numbers",
    )
