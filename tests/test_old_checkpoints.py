"""Checkpoints made by older code keep loading and computing the same thing.

``data/models_before_issue13.json`` was written by ``data/make_models_before_issue13.py`` run with
the code before issue 13's refactoring (options, layer builder, presets and the RNMT+ stack loop
moved): for tiny models of every family, the name, dtype and shape of every state-dict entry (the
values of the buffers), and the logits on a fixed batch after every parameter was drawn from its
*name* (``fill_parameters``).  The current code must build the same model from the same flags, with
the same entries (a checkpoint of the old code then loads strictly), and, with the parameters
drawn from the same names, give the same logits.  No checkpoint file is stored.
"""

import json
import os

import pytest
import torch
from fairseq import options, tasks
from helpers import dtype_marker, tiny_dictionary

from tests.data.make_models_before_issue13 import (
    fill_parameters,
)  # pytest.ini: the root on sys.path

DATA = os.path.join(os.path.dirname(__file__), "data", "models_before_issue13.json")
with open(DATA) as _f:
    SAVED = json.load(_f)

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
        parser,
        [
            "dummy-data",
            "--task",
            "translation",
            "--arch",
            arch,
            "--cpu",
            *saved["flags"],
            *_old_saved_args(arch),
        ],
    )
    model = tasks.translation.TranslationTask(args, d, d).build_model(args).eval()
    state = model.state_dict()
    assert {k: [str(v.dtype), list(v.shape)] for k, v in state.items() if not dtype_marker(k)} == {
        k: e[:2] for k, e in saved["entries"].items()
    }
    fill_parameters(model)
    buffers = {
        k: torch.tensor(e[2], dtype=getattr(torch, e[0].split(".")[1])).view(e[1])
        for k, e in saved["entries"].items()
        if e[2] is not None
    }
    model.load_state_dict({**model.state_dict(), **buffers}, strict=True)
    with torch.no_grad():
        logits, _ = model(
            torch.tensor(SAVED["src"]), torch.tensor(SAVED["lengths"]), torch.tensor(SAVED["prev"])
        )
    expected = torch.tensor(saved["logits"], dtype=torch.float32).view(saved["logits_shape"])
    # exact on the torch that wrote them; other torch versions' kernels differ in the last bits
    # (torch 2.4, the newest on Python 3.8: at most 6e-8)
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-6)
