"""Checkpoints made by older code keep loading and computing the same thing.

``data/models_before_issue13.pt`` holds the state dicts of tiny models of every family (made by
``data/make_models_before_issue13.py`` with the code before issue 13's refactoring: options,
layer builder, presets and the RNMT+ stack loop moved) and the logits each gave on a fixed batch.
The current code must build the same model from the same flags, load the state dict strictly and
give the same logits.
"""

import os

import pytest
import torch
from fairseq import options, tasks

from helpers import tiny_dictionary

DATA = os.path.join(os.path.dirname(__file__), "data", "models_before_issue13.pt")
SAVED = torch.load(DATA, weights_only=True)

# Options whose default changed after these models were made.  A real checkpoint saves its full
# args, so fairseq rebuilds it with the old value; a flag list must state that value.
OLD_SAVED_ARGS = {
    # issue 15: --agg-ffn-dim's default went from 0 (F's width d) to -1 (the stack's FFN width)
    "transformer_agg": ["--agg-ffn-dim", "0"],
}


def _old_saved_args(arch):
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY
    return OLD_SAVED_ARGS.get(ARCH_MODEL_NAME_REGISTRY.get(arch), [])


@pytest.mark.parametrize("arch", sorted(SAVED["models"]))
def test_old_state_dict_loads_and_gives_the_same_logits(arch):
    saved = SAVED["models"][arch]
    d = tiny_dictionary()
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser, ["dummy-data", "--task", "translation", "--arch", arch, "--cpu", *saved["flags"], *_old_saved_args(arch)])
    model = tasks.translation.TranslationTask(args, d, d).build_model(args).eval()
    state = dict(saved["other"])
    for key, shape, value in zip(saved["keys"], saved["shapes"],
                                 saved["flat"].split([torch.Size(s).numel() for s in saved["shapes"]])):
        state[key] = value.view(shape)
    model.load_state_dict(state, strict=True)
    with torch.no_grad():
        logits, _ = model(SAVED["src"], SAVED["lengths"], SAVED["prev"])
    torch.testing.assert_close(logits, saved["logits"], rtol=0, atol=0)
