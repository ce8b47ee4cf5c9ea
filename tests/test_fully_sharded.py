"""Fully sharded training (``--ddp-backend fully_sharded``), what can be checked without a GPU.

fairseq builds the model inside fairscale's ``enable_wrap`` (``fairseq_cli/train.py``), and each
Transformer layer goes through ``fsdp_wrap`` (and ``checkpoint_wrapper`` under
``--checkpoint-activations``) as it is built; the root module is wrapped last.  fairscale's FSDP
itself needs CUDA, so here a recording wrapper stands in for it, with FSDP's attribute rules (reads
go through to the wrapped module, assignments stay on the wrapper).  For every family that builds
Transformer layers, with ``--min-params-to-wrap 0`` and with ``--checkpoint-activations``:

- every layer of every stack is wrapped, once, as fairseq wraps its own, and checkpointed when asked;
- nothing is changed in a layer after it was wrapped (a module assigned to a wrapped layer lands on
  the wrapper, where FSDP would leave it outside the layer's flat parameters: the post-norm layer
  norm that DLCL's history takes over was replaced that way, and kept computing);
- the wrapped model computes what the unwrapped one computes (scores and every gradient), and its
  parameters are those the builder made (none made later, e.g. in the first forward), so the layer
  histories' weights, transparent attention's weights and the residual schemes' parameters are in
  the flat parameters FSDP builds: a layer's in its wrapper, the rest in the root.

The recurrent families build no Transformer layers of their own and take no
``--checkpoint-activations`` (one line, tests/test_errors.py); under fully sharded training they are
one root unit.  The GPU runs are ``benchmarks/fsdp_check.py``.
"""

import json
import sys

import pytest
import torch
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)
from helpers import build_family, dtype_marker, random_batch, run_cli
from torch import nn

from benchmarks import precision_matrix
from fairseq_deep.models import families

enable_wrap = pytest.importorskip("fairscale.nn").enable_wrap


def transformer_families():
    """The tiny configurations (precision_matrix.FAMILIES) of every family that builds Transformer
    layers."""
    return [tiny.name for family, tiny in families.tiny_configs() if family.transformer_layers]


TRANSFORMER_FAMILIES = transformer_families()


class Recorder(nn.Module):
    """Stands in for fairscale's FSDP inside ``enable_wrap``: wraps, records, computes nothing else."""

    def __init__(self, module: nn.Module, **kwargs):
        super().__init__()
        self.module = module
        self.parameters_at_wrap = {id(p) for p in module.parameters()}

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.module, name)


def _transformer_layer(module) -> bool:
    inner = module.module if isinstance(module, Recorder) else module
    return isinstance(inner, (TransformerEncoderLayerBase, TransformerDecoderLayerBase))


def _stacks(model):
    """Every list of Transformer layers our builders make (encoder, decoder, a hybrid's parts)."""
    return {
        name: lst
        for name, lst in model.named_modules()
        if isinstance(lst, nn.ModuleList) and any(_transformer_layer(m) for m in lst)
    }


def _build(family, flags, wrap: bool):
    entry = precision_matrix.FAMILIES[family]
    entry = (entry[0], entry[1], entry[2], [*entry[3], *flags], entry[4])
    if not wrap:
        return build_family(entry, seed=3)
    with enable_wrap(wrapper_cls=Recorder):
        return build_family(entry, seed=3)


def _unwrapped_names(state):
    return {k.replace("module.", ""): v for k, v in state.items()}


@pytest.mark.parametrize(
    "flags",
    [["--min-params-to-wrap", "0"], ["--checkpoint-activations"]],
    ids=["wrap-all", "checkpoint"],
)
@pytest.mark.parametrize("family", TRANSFORMER_FAMILIES)
def test_every_layer_is_wrapped_and_computes_as_unwrapped(family, flags):
    (plain, d), (wrapped, _) = _build(family, flags, wrap=False), _build(family, flags, wrap=True)
    stacks = _stacks(wrapped)
    assert stacks, f"{family}: no layer stack found"
    for name, layers in stacks.items():
        for i, layer in enumerate(layers):
            assert isinstance(layer, Recorder), f"{family}: {name}[{i}] is not wrapped"
            assert not isinstance(layer.module, Recorder), f"{family}: {name}[{i}] is wrapped twice"
            if "--checkpoint-activations" in flags:
                assert hasattr(layer.module, "precheckpoint_forward"), (
                    f"{family}: {name}[{i}] is not checkpointed"
                )
            assert not layer._modules.keys() - {"module"}, (
                f"{family}: {name}[{i}] got {sorted(layer._modules.keys() - {'module'})} after it was wrapped"
            )
            assert {id(p) for p in layer.module.parameters()} == layer.parameters_at_wrap, (
                f"{family}: {name}[{i}]'s parameters changed after it was wrapped"
            )

    assert _unwrapped_names(wrapped.state_dict()).keys() == plain.state_dict().keys()
    for key, value in _unwrapped_names(wrapped.state_dict()).items():
        assert dtype_marker(key) or torch.equal(value, plain.state_dict()[key]), key

    batch = random_batch(d)
    outputs, grads = [], []
    for model in (plain, wrapped):
        model.train()
        count = sum(p.numel() for p in model.parameters())
        torch.manual_seed(
            0
        )  # the same dropout masks (the presets' attention and activation dropout)
        out = model(*batch)[0]
        out.log_softmax(-1).sum().backward()
        assert sum(p.numel() for p in model.parameters()) == count  # nothing made in the forward
        outputs.append(out)
        grads.append({k.replace("module.", ""): p.grad for k, p in model.named_parameters()})
    torch.testing.assert_close(outputs[1], outputs[0], rtol=1e-6, atol=1e-6)
    assert grads[1].keys() == grads[0].keys()
    for key, grad in grads[0].items():
        if grad is None:
            assert grads[1][key] is None, key
        else:
            torch.testing.assert_close(grads[1][key], grad, rtol=1e-6, atol=1e-6, msg=key)


# -- bf16 under fully sharded training (patches/fully_sharded.py) ----------------------------------


def _fsdp_trainer(data, *extra):
    """fairseq's Trainer for a tiny DLCL model under ``--ddp-backend fully_sharded`` on CPU (FSDP
    itself wraps nothing here: the Trainer's own choices are what is checked)."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    args = options.parse_args_and_arch(
        options.get_training_parser(),
        [
            str(data),
            "--arch",
            "transformer_dlcl",
            *precision_matrix._TRANSFORMER_TINY,
            "--cpu",
            "--optimizer",
            "adam",
            "--lr",
            "1e-3",
            "--ddp-backend",
            "fully_sharded",
            *extra,
        ],
    )
    cfg = convert_namespace_to_omegaconf(args)
    cfg.common.tpu = False  # what fairseq's call_main gets from patches/precision.py
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    return Trainer(cfg, task, model, task.build_criterion(cfg.criterion)), cfg


def test_bf16_trains_fully_sharded_without_a_loss_scale(synthetic_bin):
    """fairseq 0.12 refuses --bf16 with fully_sharded in Trainer.__init__; lifted, the optimizer is
    the one fairseq builds for --fp16 under FSDP, with no loss scale, and --bf16 stays on."""
    from fairseq.optim.fp16_optimizer import MemoryEfficientFP16Optimizer

    trainer, cfg = _fsdp_trainer(synthetic_bin, "--bf16")
    assert isinstance(trainer.optimizer, MemoryEfficientFP16Optimizer)
    assert trainer.optimizer.scaler is None
    assert cfg.common.bf16 and not cfg.common.fp16
    fp16, _ = _fsdp_trainer(synthetic_bin, "--fp16")  # fairseq's own --fp16 path, unchanged
    assert (
        isinstance(fp16.optimizer, MemoryEfficientFP16Optimizer)
        and fp16.optimizer.scaler is not None
    )
    with pytest.raises(
        ValueError, match="not compatible with --bf16"
    ):  # bfloat16 parameters: fairseq's refusal
        _fsdp_trainer(synthetic_bin, "--bf16", "--memory-efficient-bf16")


def test_deep_att_refuses_fully_sharded_fp16_in_one_line():
    from helpers import build_model

    from fairseq_deep.errors import UserError

    with pytest.raises(
        UserError, match="fully_sharded with --fp16 is not supported by --arch deep_att_ff"
    ):
        build_model("deep_att_ff", ["--ddp-backend", "fully_sharded", "--fp16"])
    build_model(
        "deep_att_ff", ["--ddp-backend", "fully_sharded", "--bf16"]
    )  # bfloat16 has float32's range


@pytest.mark.parametrize(
    "precision,dtype,mixed",
    [
        ("--bf16", "torch.bfloat16", True),
        ("--fp16", "torch.float16", True),
        (None, "torch.float32", False),
    ],
)
def test_through_call_main_one_process_gets_a_group_and_the_precision(
    synthetic_bin, tmp_path, precision, dtype, mixed
):
    """fairseq-train's way in, fairseq's call_main, under --ddp-backend fully_sharded:

    - fairscale 0.4's FSDP asks torch.distributed for a reduce-scatter group in its constructor, and
      fairseq runs one process without torch.distributed ("torch.distributed is not yet initialized
      but process group is requested"): a run of one process gets a group of one (gloo here,
      without a GPU); c10d runs stay without one;
    - the wrapping context that fairseq's fsdp_enable_wrap gives FSDP computes in bfloat16 under
      --bf16 (float32 before), and as fairseq chose otherwise.

    In a subprocess: a process group is process-wide state."""
    script = tmp_path / "probe.py"
    script.write_text(
        "import sys, torch.distributed as dist\n"
        "import fairseq_deep\n"
        "from fairscale.nn.wrap.auto_wrap import ConfigAutoWrap\n"
        "from fairseq import options\n"
        "from fairseq.dataclass.utils import convert_namespace_to_omegaconf\n"
        "from fairseq.distributed import fsdp_enable_wrap, utils\n"
        "args = options.parse_args_and_arch(options.get_training_parser(), sys.argv[1:])\n"
        "def main(cfg):\n"
        "    group = dist.is_initialized()\n"
        "    print('group', group and dist.get_world_size(), group and dist.get_backend())\n"
        "    if cfg.distributed_training.ddp_backend == 'fully_sharded':\n"
        "        with fsdp_enable_wrap(cfg.distributed_training):\n"
        "            print('wrap', ConfigAutoWrap.kwargs['compute_dtype'], ConfigAutoWrap.kwargs['mixed_precision'])\n"
        "utils.call_main(convert_namespace_to_omegaconf(args), main)\n"
    )
    common = [
        str(synthetic_bin),
        "--arch",
        "transformer_dlcl",
        "--cpu",
        "--optimizer",
        "adam",
        *([precision] if precision else []),
    ]
    sharded = run_cli(sys.executable, str(script), *common, "--ddp-backend", "fully_sharded")
    assert "group 1 gloo" in sharded.stdout, sharded.stdout + sharded.stderr[-2000:]
    assert f"wrap {dtype} {mixed}" in sharded.stdout, sharded.stdout + sharded.stderr[-2000:]
    plain = run_cli(sys.executable, str(script), *common)
    assert "group False False" in plain.stdout, plain.stdout + plain.stderr[-2000:]


@pytest.mark.gpu
def test_fully_sharded_trains_as_c10d_on_a_gpu(synthetic_bin, tmp_path):
    """On CUDA: a DLCL model trains the same losses (float32 rounding) under fully sharded training,
    with and without activation checkpointing, as under c10d, logs the same parameter count, and
    fairseq-generate decodes its checkpoint (benchmarks/fsdp_check.py does this at paper sizes)."""
    from benchmarks import fsdp_check

    model = ["--arch", "transformer_dlcl", *precision_matrix._TRANSFORMER_TINY, "--dropout", "0"]
    rows = {}
    for mode in ("c10d_fp32", "fsdp_fp32", "fsdp_fp32_ckpt"):
        cmd = fsdp_check.train_command(
            str(synthetic_bin),
            str(tmp_path / mode),
            model,
            fsdp_check.MODES[mode][0],
            updates=5,
            max_tokens=1000,
        )
        rows[mode] = fsdp_check.run(cmd, str(tmp_path / f"{mode}.log"), timeout=300)
        assert rows[mode]["status"] == 0, rows[mode].get("tail")
    fsdp_check.compare(rows)
    for mode in ("fsdp_fp32", "fsdp_fp32_ckpt"):
        assert rows[mode]["max_loss_diff"] < 1e-3 and rows[mode]["params_equal"], rows[mode]
    decoded = fsdp_check.generate(
        str(synthetic_bin),
        str(tmp_path / "fsdp_fp32" / "checkpoint_last.pt"),
        str(tmp_path / "generate.log"),
        timeout=300,
    )
    assert decoded["status"] == 0 and decoded["hypotheses"] > 0, decoded


# -- --use-sharded-state: each rank's own shard (fairseq issues #4275, #4307) ---------------------

#: fairseq programs in one process, each as its console script runs it (``fairseq_deep.cli``), with
#: fairscale's FSDP computing on the CPU: FSDP runs on CUDA only (its streams), so here its compute
#: device is the CPU, its streams are one object that waits for nothing, and the three CUDA calls
#: of a world of one (a synchronize, a tensor's record_stream, fairseq's gradient norm moved to
#: CUDA) do nothing; a stand-in for a GPU's fully sharded run, for tests only
FSDP_ON_CPU = """\
import contextlib, functools, json, sys
import torch
from fairscale.nn.data_parallel import fully_sharded_data_parallel as fsdp_module
FSDP = fsdp_module.FullyShardedDataParallel
init, setup = FSDP.__init__, FSDP._setup_streams
class Stream:
    def wait_stream(self, other): pass
    def synchronize(self): pass
STREAM = Stream()
@functools.wraps(init)
def on_cpu(self, *args, **kwargs):
    kwargs["compute_device"] = torch.device("cpu")
    return init(self, *args, **kwargs)
def setup_streams(self):
    available, stream = torch.cuda.is_available, torch.cuda.Stream
    torch.cuda.is_available, torch.cuda.Stream = (lambda: True), (lambda: STREAM)
    try:
        setup(self)
    finally:
        torch.cuda.is_available, torch.cuda.Stream = available, stream
FSDP.__init__, FSDP._setup_streams = on_cpu, setup_streams
torch.cuda.current_stream = lambda *args, **kwargs: STREAM
torch.cuda.stream = lambda stream: contextlib.nullcontext()
torch.cuda.synchronize = lambda *args, **kwargs: None
torch.Tensor.record_stream = lambda self, stream: None
torch.Tensor.cuda = lambda self, *args, **kwargs: self
from fairseq_deep import cli
for i, (program, argv) in enumerate(json.loads(sys.argv[1])):
    print(f"=== program {i}", flush=True)
    sys.argv = [program, *argv]
    try:
        getattr(cli, program)()
    except SystemExit as e:
        if e.code:
            raise
"""


def test_a_sharded_state_run_resumes_and_decodes(synthetic_bin, tmp_path):
    """A fully sharded run saved with --use-sharded-state writes each rank's shard
    (checkpoint_last-shard0.pt).  Training resumes from it exactly: the losses of updates 4-5 after
    a stop at 3 are those of a c10d run of 5 updates (as are those of 1-3: a world of one).
    fairseq-deep-generate decodes it, every test sentence: fairseq loaded the shard's flat
    parameters into the model and stopped ("Missing key(s) ... Unexpected key(s): flat_param_0",
    fairseq issues #4275, #4307; fairscale's consolidation kept only the last wrapped layer's tied
    names); the shards read as one are the c10d run's parameters, tied embeddings included; the
    tools read it as one too, and a missing shard is one line."""
    from fairseq import checkpoint_utils

    from fairseq_deep import checkpoints, runs
    from fairseq_deep.errors import CheckpointError

    data = str(synthetic_bin)
    model = ["--arch", "transformer_dlcl", *precision_matrix._TRANSFORMER_TINY, "--dropout", "0"]
    model += ["--share-all-embeddings", "--min-params-to-wrap", "0"]
    common = [data, "--cpu", "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "500"]
    common += [*model, "--seed", "1", "--no-epoch-checkpoints", "--disable-validation"]
    common += ["--log-format", "json", "--log-interval", "1", "--num-workers", "0"]
    sharded = ["--ddp-backend", "fully_sharded", "--use-sharded-state"]

    def train(save, updates, *extra):
        return [
            "train",
            [*common, *extra, "--save-dir", str(tmp_path / save), "--max-update", str(updates)],
        ]

    decoded = tmp_path / "decoded"
    generate = [data, "--path", str(tmp_path / "sharded" / "checkpoint_last.pt"), "--cpu"]
    generate += ["--beam", "1", "--max-len-b", "5", "--results-path", str(decoded)]
    programs = [
        train("c10d", 5),
        train("sharded", 3, *sharded),
        train("sharded", 5, *sharded),
        ["generate", generate],
    ]
    script = tmp_path / "fsdp_on_cpu.py"
    script.write_text(FSDP_ON_CPU)
    run = run_cli(sys.executable, str(script), json.dumps(programs))

    outputs = run.stdout.split("=== program ")[1:]

    def losses(*programs):
        records = [r for i in programs for r in runs.parse_log_lines(outputs[i].splitlines())]
        return {r["num_updates"]: r["loss"] for r in records if r["kind"] == "train_inner"}

    assert runs.parse_loaded_update(outputs[2]) == 3, outputs[2][-3000:]
    assert losses(1, 2) == losses(0) and sorted(losses(0)) == [1, 2, 3, 4, 5]
    assert [p.name for p in (tmp_path / "sharded").glob("checkpoint*")] == [
        "checkpoint_last-shard0.pt"
    ]
    hypotheses = runs.read_generate(str(decoded / "generate-test.txt")).tokens
    assert sorted(hypotheses) == list(range(101))

    (one,), _, _ = checkpoint_utils.load_model_ensemble_and_task(
        [str(tmp_path / "sharded" / "checkpoint_last.pt")]
    )
    (reference,), _, _ = checkpoint_utils.load_model_ensemble_and_task(
        [str(tmp_path / "c10d" / "checkpoint_last.pt")]
    )
    mine, theirs = one.state_dict(), reference.state_dict()
    assert mine.keys() == theirs.keys()
    for key, value in theirs.items():
        if key.endswith("._float_tensor"):  # fairseq's marker of a dtype: uninitialised memory
            continue
        torch.testing.assert_close(mine[key], value, rtol=1e-5, atol=1e-6, msg=key)
    assert one.decoder.output_projection.weight is one.encoder.embed_tokens.weight
    tools = checkpoints.load(str(tmp_path / "sharded" / "checkpoint_last.pt"))
    assert tools["model"].keys() <= theirs.keys() and "last_optimizer_state" not in tools

    shard = torch.load(tmp_path / "sharded" / "checkpoint_last-shard0.pt")
    shard["cfg"]["distributed_training"]["distributed_world_size"] = 2
    (tmp_path / "lost").mkdir()
    torch.save(shard, tmp_path / "lost" / "checkpoint_last-shard0.pt")
    with pytest.raises(
        CheckpointError, match="of 2 shards .* 1 found .* copy every checkpoint_last-shardR.pt"
    ):
        checkpoints.load(str(tmp_path / "lost" / "checkpoint_last.pt"))
