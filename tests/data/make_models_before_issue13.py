"""Makes tests/data/models_before_issue13.pt: state dicts of tiny models of every family and their
logits on a fixed batch, saved as plain tensors and strings (weights-only loadable).  It was run
with the code before issue 13 (usage: python make_models_before_issue13.py OUT.pt); kept for the record."""
import os
import sys
import torch
from fairseq import options, tasks
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from helpers import random_batch, tiny_dictionary
import fairseq_deep  # noqa

T = ["--encoder-embed-dim", "4", "--decoder-embed-dim", "4", "--encoder-ffn-embed-dim", "8",
     "--decoder-ffn-embed-dim", "8", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
     "--encoder-layers", "2", "--decoder-layers", "2", "--dropout", "0"]
R = ["--encoder-embed-dim", "4", "--decoder-embed-dim", "4", "--encoder-hidden-size", "4",
     "--decoder-hidden-size", "4", "--rnmt-attention-heads", "2", "--encoder-layers", "3", "--decoder-layers", "3",
     "--dropout", "0"]
H = [*T, "--encoder-hidden-size", "4", "--decoder-hidden-size", "4", "--rnmt-attention-heads", "2",
     "--rnmt-encoder-layers", "2"]
D = ["--encoder-embed-dim", "4", "--decoder-embed-dim", "4", "--encoder-hidden-size", "4",
     "--decoder-hidden-size", "4", "--encoder-layers", "2", "--decoder-layers", "2", "--dropout", "0"]
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

d = tiny_dictionary()
src, lengths, prev = random_batch(d)
out = {"src": src, "lengths": lengths, "prev": prev, "models": {}}
for arch, flags in MODELS.items():
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, ["dummy-data", "--task", "translation", "--arch", arch, "--cpu", *flags])
    task = tasks.translation.TranslationTask(args, d, d)
    torch.manual_seed(3)
    model = task.build_model(args).eval()
    with torch.no_grad():  # random, not trained: perturb every parameter so that all of them matter
        g = torch.Generator().manual_seed(4)
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
        logits, _ = model(src, lengths, prev)
    state = model.state_dict()
    floats = [k for k, v in state.items() if v.is_floating_point()]
    out["models"][arch] = {
        "flags": list(flags), "keys": floats, "shapes": [list(state[k].shape) for k in floats],
        "flat": torch.cat([state[k].reshape(-1) for k in floats]),
        "other": {k: v.clone() for k, v in state.items() if not v.is_floating_point()},
        "logits": logits}
torch.save(out, sys.argv[1])
print(sum(m["flat"].numel() for m in out["models"].values()), "numbers")
