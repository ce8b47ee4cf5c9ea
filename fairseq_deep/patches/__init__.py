"""Every patch of fairseq (and of torch and fairscale) in one package: one module per concern, each
naming in its docstring the fairseq behaviour it replaces, the versions it applies to and the test
that pins it.  Each wraps fairseq's own function and calls it (:mod:`.install`); none changes
results on GPUs, except that ``--bf16`` works there (also fully sharded).

Installed by :func:`apply` when ``fairseq_deep`` is imported (so also by plain ``fairseq-train
--user-dir``, the hub interface and worker processes):

- version shims, where fairseq 0.12 (or torch, fairscale) of a version fails or does wrong:
  :mod:`.safe_loading` (torch's weights-only loading), :mod:`.evaluation_batches` (the final
  partial batch), :mod:`.distributed_cpu` (torchrun without GPUs), :mod:`.precision`
  (``--bf16``/``--fp16`` where fairseq assumes a TPU or a GPU), :mod:`.fully_sharded` (FSDP in
  bfloat16, on one GPU);
- error messages, where fairseq stops without saying the cause or the fix:
  :mod:`.checkpoint_errors` (a refused, truncated or foreign checkpoint; another architecture),
  :mod:`.usage_errors` (a data folder, a dictionary, ``--memory-efficient-fp16``);
- the hub interface in the user's own process: :mod:`.hub` (``from_pretrained`` on sentencepiece
  data);
- what fairseq forgets: :mod:`.checkpoint_history` (a restored checkpoint's history, grown from,
  continued, averaged, saved again with every checkpoint of the run), :mod:`.validation_time` (when
  each validation happened: the training clock in its record, to 0.01 s).

Not here: fairseq 0.12.2's fused encoder path, turned off in the layers the package builds, is
the layers' own (:mod:`fairseq_deep.modules.common.better_transformer`, called by the layer
builders, installed by none), so that this folder stands on one floor (docs/design.md, "Floors").

Installed by the console scripts only (:mod:`.scripts`): :mod:`.arguments`, :mod:`.training_progress`,
:mod:`.decoding_progress`, :mod:`.interactive`.

This file imports nothing at import time: importing one patch module imports none of the others.
"""


def apply():
    """Install the patches of the package's import (idempotent: a second call changes nothing)."""
    from . import (
        checkpoint_errors,
        checkpoint_history,
        distributed_cpu,
        evaluation_batches,
        fully_sharded,
        hub,
        precision,
        safe_loading,
        usage_errors,
        validation_time,
    )

    for patches in (
        safe_loading,
        evaluation_batches,
        checkpoint_errors,
        checkpoint_history,
        usage_errors,
        distributed_cpu,
        precision,
        hub,
        fully_sharded,
        validation_time,
    ):
        patches.apply()
