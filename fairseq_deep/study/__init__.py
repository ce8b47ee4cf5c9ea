"""The papers' comparisons as one command: train, translate and score a set of systems.

    fairseq-deep-study --data DIR --out DIR [--spm MODEL | --remove-bpe KIND]
        [--group NAME]... [--system NAME=ARCH [FLAGS...]]...
        [--max-update N] [--minutes M] [--seeds K] [--jobs J] [--cpu]
        [--width W] [--lr LR] [--warmup N] [--dropout P] [--max-tokens N]
        [--precision fp16|amp|bf16|...] [--valid-interval N|epoch] [--patience N]
        [--train-args "..."] [--gen-args "..."] [--ref FILE] [--depths 6,20]

(also ``python -m fairseq_deep.study``).  For every system and seed it runs the real
``python -m fairseq_cli.train`` (``--user-dir`` this package) and ``python -m fairseq_cli.generate``
as subprocesses, ``--jobs`` of them at a time, scores every test sentence with sacreBLEU and chrF on
detokenized text, and writes ``OUT/results.json``, ``OUT/results.md`` and PNG plots under
``OUT/plots/``.  See docs/study.md for the full interface.

A ``--system`` value is split with :func:`shlex.split` (shell quoting rules): the first word is
``NAME=ARCH``, every later word goes to fairseq-train as it is, after the study's own flags (so it
wins: fairseq keeps the last value of a repeated option).  ``--train-args`` and ``--gen-args`` are
split the same way.

Resuming: every (system, seed) runs in ``OUT/runs/GROUP/NAME/seedS``.  A run whose ``result.json``
exists is not run again; an interrupted one restarts fairseq-train in the same ``--save-dir``, which
resumes from ``checkpoint_last.pt`` (fairseq's own resume; ``--stop-time-hours`` counts the
training time saved in the checkpoint, so the budget holds across restarts).

The package: :mod:`.systems` (a row), :mod:`.groups` (the built-in groups, as data),
:mod:`.commands` (fairseq command lines), :mod:`.runner` (the runs and their steps),
:mod:`.report` (results.json's object, results.md, plots), :mod:`.claims` (the papers' claims each
group tests: docs/study.md's "At Base width on a GPU"), :mod:`.cli` (the command line).
"""

from ..errors import UserError  # noqa: F401
from ..runs import model_kind, paired_bootstrap, score, width_flags  # noqa: F401
from .cli import cli_main, get_parser, main, select_groups  # noqa: F401
from .commands import (  # noqa: F401
    generate_command,
    generate_run,
    interval,
    recipe,
    recipe_text,
    stage_commands,
    stage_runs,
    train_command,
    train_run,
)
from .groups import (  # noqa: F401
    DEPTH_FAMILIES,
    DIVERSITY,
    GROUPS,
    MODERN_FAMILIES,
    DepthSweep,
    Grown,
    Rows,
    expand_group,
    parse_depths,
)
from .report import markdown, plot, results  # noqa: F401
from .runner import RunState, Study, learning_curve, parse_generate, record  # noqa: F401
from .systems import CUSTOM, System, infer_depth, parse_system, shaped_system  # noqa: F401
