"""What one step costs, counted: kernel launches, host syncs and FLOPs of a beam-search decoding
step and of a training step, each system against its reference.

    python -m benchmarks.step_cost                                     # both phases and groups, Base width
    python -m benchmarks.step_cost --phase decode --group aggregation  # Dou et al.'s rows 1-7 against row 1
    python -m benchmarks.step_cost --phase train --group recurrent     # RNMT+, Deep-Att against fairseq's lstm
    python -m benchmarks.step_cost --group schemes                     # HC, mHC (Sinkhorn) against pre-norm

A step's time has two floors.  Where every kernel costs about its launch, a few microseconds
whatever its size (a GPU at beam search's small batches, a recurrent loop's per-time-step
kernels), the step is *launch-bound* and time follows the number of kernels; where the arithmetic
dominates (large batches, a CPU at paper width) it is *compute-bound* and time follows the FLOPs.
This script runs each step once under a ``TorchDispatchMode`` that sees every ATen operator and
once under torch's ``FlopCounterMode``:

* ``--phase decode``: fairseq's ``SequenceGenerator`` (beam ``--beam``, output forced to
  ``--gen-len``, ``--gen-batch`` random sentences), split into the encoder (once per batch), the
  decoder's steps, the beam's reordering of the incremental state and the rest (the generator's
  bookkeeping), per decoding step;
* ``--phase train``: one forward and backward of a fixed ``--train-batch`` x ``--train-len`` batch
  (cross-entropy, dropout 0.1); Adam's update is timed but not counted (its kernels follow the
  number of parameter tensors and the device's foreach default, not the model);

and reports ``kernels`` (every ATen call but views, metadata and allocations without a fill: on a
GPU each is at least one launch; plus every launch of a Triton kernel, the fused recurrent cells
that ``auto`` runs on CUDA), ``syncs`` (calls that make the host wait for the device:
``.item()``, ``bool(tensor)``, ``nonzero``, ``masked_select``), matmul FLOPs (torch's counter: mm,
bmm, addmm, baddbmm, attention; and the fused recurrent layers of ``nn.LSTM``, which it
leaves at zero), and each system's speed ratio to its reference if time followed
kernels, if it followed FLOPs, and as measured (tokens/s, median of ``--repeats`` rounds in which
the systems alternate).  With ``TRITON_INTERPRET=1`` a CPU runs the fused cells as CUDA does
(``auto``), and their launches are counted without the interpreter's own tensor moves; the
measured ratio then means nothing.  The counts barely depend on the device (the same ATen calls; a composite
op may decompose differently: fairseq's ``LSTMCell`` is one fused cell on CUDA and ~10 kernels on a
CPU, ``nn.LSTM`` one call on both), so the floors can be read off a CPU run; the measured ratio
needs the device it claims.  ``--profile FILE`` runs one more step of each system under torch's
profiler and appends its operators of most self time (the GPU's on a GPU) to FILE: where the time
goes, beside the counts.
"""

if __name__ == "__main__" and not __package__:  # run as a file, the package's imports would fail
    raise SystemExit(
        "benchmarks/step_cost.py is a module of the benchmarks package: run it from the "
        "repository root as python -m benchmarks.step_cost"
    )

import collections
import statistics
import sys
from typing import Callable, Dict, List, Tuple

import torch
from fairseq.data import Dictionary
from fairseq.sequence_generator import SequenceGenerator
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

import fairseq_deep  # noqa: F401  (registers the architectures)
from fairseq_deep.runs import recipes

from . import harness
from .aggregation_speed import VARIANTS as AGGREGATION_VARIANTS
from .deep_att_speed import dictionary  # a vocabulary of N entries, as deep_att_speed.py's
from .harness import add_device_argument, describe, device_from_args

#: operators that launch nothing: views, metadata, allocations without a fill
NO_KERNEL = frozenset(
    """
    view _unsafe_view reshape _reshape_alias transpose t permute slice select unsqueeze squeeze expand
    expand_as view_as split split_with_sizes unsafe_split chunk unbind alias as_strided detach narrow
    movedim lift_fresh empty new_empty empty_like empty_strided _local_scalar_dense sym_size sym_stride
    sym_numel sym_storage_offset is_same_size diagonal real imag _to_copy_noop
""".split()
)
#: operators that make the host wait for the device
SYNCS = frozenset("_local_scalar_dense nonzero masked_select is_nonzero".split())


def _rnn_flops(forward_multiple: int):
    """FLOPs of a fused recurrent layer (oneDNN's ``mkldnn_rnn_layer`` on a CPU, cuDNN's
    ``_cudnn_rnn`` on a GPU: what ``nn.LSTM`` runs), which torch's counter does not know: the input
    and recurrent products of every step, 2 x rows x (|W_ih| + |W_hh|) per layer and direction;
    ``forward_multiple`` 2 for a backward (the gradients of the inputs and of the weights)."""

    def flops(*args, out_shape=None, **kwargs) -> int:
        inputs, weights = args[0], args[1]
        if not isinstance(
            weights, torch.Size
        ):  # cuDNN: a list of every layer's and direction's weights
            matrices = [w for w in weights if len(w) == 2]
        else:  # oneDNN, one layer and direction: W_ih, W_hh, b_ih, b_hh
            matrices = [args[1], args[2]]
        rows = (
            inputs[0] if len(inputs) == 2 else inputs[0] * inputs[1]
        )  # packed (N x I) or T x B x I
        return forward_multiple * 2 * rows * sum(m[0] * m[1] for m in matrices)

    return flops


#: FLOP formulas of the ops torch's counter leaves at zero (what a fused nn.LSTM calls)
EXTRA_FLOPS = {
    op: _rnn_flops(multiple)
    for op, multiple in (
        (getattr(torch.ops.aten, "mkldnn_rnn_layer", None), 1),
        (getattr(torch.ops.aten, "mkldnn_rnn_layer_backward", None), 2),
        (getattr(torch.ops.aten, "_cudnn_rnn", None), 1),
        (getattr(torch.ops.aten, "_cudnn_rnn_backward", None), 2),
    )
    if op is not None
}


def flop_counter() -> FlopCounterMode:
    return FlopCounterMode(display=False, custom_mapping=EXTRA_FLOPS)


DECODE_SECTIONS = ("encoder", "decoder", "reorder", "generator")
TRAIN_SECTIONS = ("forward", "backward")


def _triton_launchers() -> list:
    """The classes whose ``run`` launches a Triton kernel: compiled, and the CPU interpreter's."""
    classes = []
    for module, name in (
        ("triton.runtime.jit", "JITFunction"),
        ("triton.runtime.interpreter", "InterpretedFunction"),
    ):
        try:
            classes.append(getattr(__import__(module, fromlist=[name]), name))
        except (ImportError, AttributeError):
            pass
    return classes


class OpCounter(TorchDispatchMode):
    """Counts ATen calls by ``section``, which its user switches as the step goes on, and the
    launches of Triton kernels (the fused LN-LSTM and Deep-Att cells), which are no ATen calls and
    which it records as ``triton:<kernel>``."""

    def __init__(self, sections: Tuple[str, ...], section: str):
        super().__init__()
        self.section = section
        self.ops: Dict[str, collections.Counter] = {s: collections.Counter() for s in sections}
        self._patched = []
        self._launching = (
            0  # inside a Triton launch: its own ATen calls are no kernels of the model
        )

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self._launching:  # Triton's CPU interpreter moves a kernel's tensors with ATen calls
            self.ops[self.section][func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        for cls in _triton_launchers():
            self._patched.append((cls, cls.run))
            cls.run = self._counting(cls.run)
        return super().__enter__()

    def __exit__(self, *exc):
        for cls, run in reversed(self._patched):
            cls.run = run
        self._patched = []
        return super().__exit__(*exc)

    def _counting(self, run):
        def launch(kernel, *args, **kwargs):
            self.ops[self.section]["triton:" + getattr(kernel.fn, "__name__", "kernel")] += 1
            self._launching += 1
            try:
                return run(kernel, *args, **kwargs)
            finally:
                self._launching -= 1

        return launch

    def totals(self, section: str) -> Dict[str, int]:
        c = self.ops[section]
        return {
            "ops": sum(c.values()),
            "kernels": sum(n for name, n in c.items() if name not in NO_KERNEL),
            "syncs": sum(n for name, n in c.items() if name in SYNCS),
        }


class DecodeSections:
    """Wraps a model's encoder, decoder and ``reorder_incremental_state_scripting`` so that a
    counter knows which of them is running, and counts the decoder's calls (the steps)."""

    def __init__(self, model):
        self.counter, self.flop_mode, self.steps = None, None, 0
        self.flops = dict.fromkeys(DECODE_SECTIONS, 0)
        for section, owner, name in (
            ("encoder", model.encoder, "forward"),
            ("decoder", model.decoder, "forward"),
            ("reorder", model.decoder, "reorder_incremental_state_scripting"),
        ):
            setattr(owner, name, self._wrap(section, getattr(owner, name)))

    def _wrap(self, section, fn):
        def wrapped(*args, **kwargs):
            if section == "decoder":
                self.steps += 1
            outer = self.counter.section if self.counter is not None else None
            if self.counter is not None:
                self.counter.section = section
            before = self.flop_mode.get_total_flops() if self.flop_mode is not None else 0
            try:
                return fn(*args, **kwargs)
            finally:
                if self.flop_mode is not None:
                    self.flops[section] += self.flop_mode.get_total_flops() - before
                if self.counter is not None:
                    self.counter.section = outer

        return wrapped

    def count(self, run: Callable) -> OpCounter:
        self.steps, self.counter = 0, OpCounter(DECODE_SECTIONS, "generator")
        try:
            with self.counter:
                run()
        finally:
            counter, self.counter = self.counter, None
        return counter

    def count_flops(self, run: Callable) -> Dict[str, int]:
        self.flops = dict.fromkeys(DECODE_SECTIONS, 0)
        with flop_counter() as mode:
            self.flop_mode = mode
            try:
                run()
            finally:
                self.flop_mode = None
            total = mode.get_total_flops()
        self.flops["generator"] = total - sum(v for s, v in self.flops.items() if s != "generator")
        return dict(self.flops)


def transformer_argv(arch: str, a) -> List[str]:
    return [
        "--arch",
        arch,
        *recipes.dropout("0.1"),
        *recipes.layers(a.layers, a.layers),
        *recipes.transformer_size(a.embed_dim, a.ffn_dim, a.heads),
        "--share-all-embeddings",
    ]


def recurrent_argv(arch: str, a) -> List[str]:
    argv = [
        "--arch",
        arch,
        *recipes.dropout("0.1"),
        *recipes.layers(a.layers, a.layers),
        *recipes.rnn_size(a.embed_dim, a.hidden),
    ]
    if arch == "lstm":  # fairseq's: bidirectional encoder, attention, output width E
        argv += [
            "--encoder-bidirectional",
            "--decoder-out-embed-dim",
            str(a.embed_dim),
            "--adaptive-softmax-cutoff",
            "0",
        ]
    return argv


#: group: (reference --arch, [(label, --arch)], argv builder)
GROUPS = {
    "aggregation": (
        "transformer_agg_baseline",
        AGGREGATION_VARIANTS,
        transformer_argv,
    ),  # Dou et al.'s Table 1
    "recurrent": (
        "lstm",
        [("fairseq lstm", "lstm"), ("RNMT+", "rnmt_plus"), ("Deep-Att F-F", "deep_att_ff")],
        recurrent_argv,
    ),
    # issue 47: what mHC's Sinkhorn-Knopp iterations cost (Xie et al. 2025: 20 in every
    # sublayer), against the same hyper-connections without them and pre-norm
    "schemes": (
        "transformer_prenorm",
        [
            ("pre-norm", "transformer_prenorm"),
            ("hyper-connections x4", "transformer_hc"),
            ("mHC x4", "transformer_mhc"),
        ],
        transformer_argv,
    ),
}


def decode_counted(model, d: Dictionary, a):
    """Counts of one forced-length beam search of ``--gen-batch`` random sentences, and the
    generation itself (returning the number of tokens) for the timed rounds."""
    g = torch.Generator().manual_seed(a.seed)
    src = torch.randint(d.nspecial, len(d), (a.gen_batch, a.src_len), generator=g)
    src[:, -1] = d.eos()
    sample = {
        "net_input": {
            "src_tokens": src.to(a.device),
            "src_lengths": torch.full((a.gen_batch,), a.src_len).to(a.device),
        }
    }
    model.eval()
    gen = SequenceGenerator(
        [model], d, beam_size=a.beam, max_len_a=0, max_len_b=a.gen_len, min_len=a.gen_len
    )
    sections = DecodeSections(model)

    def generate() -> int:
        with torch.no_grad():
            return sum(len(h[0]["tokens"]) for h in gen.forward(sample))

    generate()  # warm-up: TorchScript profiling runs, allocator
    counter = sections.count(generate)
    steps = sections.steps
    flops = sections.count_flops(generate)
    per_step = {
        s: {k: v / steps for k, v in counter.totals(s).items()}
        for s in DECODE_SECTIONS
        if s != "encoder"
    }
    row = {
        "steps": steps,
        "encoder": counter.totals("encoder"),
        "per_step": per_step,
        "step_kernels": sum(per_step[s]["kernels"] for s in per_step),
        "step_syncs": sum(per_step[s]["syncs"] for s in per_step),
        "step_mflop": sum(flops[s] for s in per_step) / steps / 1e6,
        "decoder_mflop": flops["decoder"] / steps / 1e6,
        "encoder_mflop": flops["encoder"] / 1e6,
        "decoder_ops": dict(counter.ops["decoder"]),
    }
    return row, generate


def train_counted(model, d: Dictionary, a):
    """Counts of one training forward and backward on a fixed random batch, and the whole step
    (forward, backward, Adam; returning the number of target tokens) for the timed rounds."""
    g = torch.Generator().manual_seed(a.seed)
    B, T = a.train_batch, a.train_len
    src = torch.randint(d.nspecial, len(d), (B, T), generator=g)
    tgt = torch.randint(d.nspecial, len(d), (B, T), generator=g)
    src[:, -1] = tgt[:, -1] = d.eos()
    prev = torch.cat([torch.full((B, 1), d.eos()), tgt[:, :-1]], 1)
    src, lengths, prev, tgt = (t.to(a.device) for t in (src, torch.full((B,), T), prev, tgt))
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)

    def loss():
        logits = model(src, lengths, prev)[0]
        return torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), tgt.reshape(-1))

    def step() -> int:
        opt.zero_grad(set_to_none=True)
        loss().backward()
        opt.step()
        return tgt.numel()

    step()  # warm-up
    counter = OpCounter(TRAIN_SECTIONS, "forward")
    with counter:
        value = loss()
        counter.section = "backward"
        value.backward()
    with flop_counter() as mode:
        value = loss()
        forward = mode.get_total_flops()
        value.backward()
        backward = mode.get_total_flops() - forward
    model.zero_grad(set_to_none=True)
    fwd, bwd = counter.totals("forward"), counter.totals("backward")
    row = {
        "forward": fwd,
        "backward": bwd,
        "step_kernels": fwd["kernels"] + bwd["kernels"],
        "step_syncs": fwd["syncs"] + bwd["syncs"],
        "step_mflop": (forward + backward) / 1e6,
        "forward_mflop": forward / 1e6,
        "backward_mflop": backward / 1e6,
    }
    return row, step


PHASES = {"decode": decode_counted, "train": train_counted}


#: operators in a profile's table, by their own time on the device that ran them
PROFILE_ROWS = 25


def write_profile(path: str, title: str, run: Callable, a):
    """One more call of ``run`` (a whole beam search or training step) under torch's profiler,
    appended to ``path`` as a section ``title``: the :data:`PROFILE_ROWS` operators of most self
    time (the GPU's where it ran on one, else the CPU's), with their calls: where a step's time
    goes, beside the counts (issue 47: a decoding step where a GPU speed target is missed)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = str(a.device).startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        run()
        if cuda:
            torch.cuda.synchronize()
    key = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=key, row_limit=PROFILE_ROWS)
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"## {title}, {describe(a.device)}\n\n{table}\n")


def run_group(name: str, a, phase: str = "decode") -> List[Dict[str, object]]:
    """Counts every system of the group in ``phase``, then times them in alternated rounds (A B C
    ... A B C ...: a slow moment of the machine hits every system alike)."""
    reference, systems, argv_of = GROUPS[name]
    d = dictionary(a.vocab)
    rows, runs = [], []
    for label, arch in systems:
        model = harness.build_model(argv_of(arch, a), d, a.device, a.seed)
        row, run = PHASES[phase](model, d, a)
        row.update(
            label=label,
            arch=arch,
            group=name,
            phase=phase,
            seconds=[],
            params=sum(p.numel() for p in model.parameters()),
        )
        rows.append(row)
        runs.append(run)
        print(
            f"[step_cost] {phase} {label}: {row['step_kernels']:.0f} kernels, {row['step_syncs']:.1f} syncs, "
            f"{row['step_mflop']:.1f} MFLOP a step",
            file=sys.stderr,
            flush=True,
        )
    timings = harness.alternated(
        {i: (lambda r, run=run: harness.timed(run, a.device)) for i, run in enumerate(runs)},
        a.repeats,
    )
    for i, row in enumerate(rows):
        row["seconds"] = [seconds for _, seconds in timings[i]]
        row["tokens"] = timings[i][-1][0]
    for row in rows:
        row["tokens_per_s"] = row["tokens"] / statistics.median(row["seconds"])
    if a.profile:
        for row, run in zip(rows, runs):
            write_profile(a.profile, f"{phase}, {name}: {row['label']} ({row['arch']})", run, a)
    ref = next(r for r in rows if r["arch"] == reference)
    for r in rows:
        r["ratio_launch_bound"] = ref["step_kernels"] / r["step_kernels"]
        r["ratio_compute_bound"] = ref["step_mflop"] / r["step_mflop"]
        r["ratio_measured"] = r["tokens_per_s"] / ref["tokens_per_s"]
    return rows


def _decode_cells(r) -> List[str]:
    step = r["per_step"]
    return [
        f"{step['decoder']['kernels']:.0f}",
        f"{step['reorder']['kernels']:.0f}",
        f"{step['generator']['kernels']:.0f}",
        f"{r['step_syncs']:.1f}",
        f"{r['step_mflop']:.1f}",
    ]


def _train_cells(r) -> List[str]:
    return [
        str(r["forward"]["kernels"]),
        str(r["backward"]["kernels"]),
        str(r["step_syncs"]),
        f"{r['forward_mflop'] / 1e3:.2f}",
        f"{r['backward_mflop'] / 1e3:.2f}",
    ]


COLUMNS = {
    "decode": (
        ["decoder kernels", "reorder kernels", "generator kernels", "syncs", "MFLOP"],
        _decode_cells,
    ),
    "train": (
        ["forward kernels", "backward kernels", "syncs", "GFLOP forward", "GFLOP backward"],
        _train_cells,
    ),
}


def table(rows: List[Dict[str, object]]) -> str:
    """A markdown table of one group's rows (one phase)."""
    names, cells = COLUMNS[rows[0]["phase"]]
    names = [
        "system",
        "`--arch`",
        "params",
        *names,
        "ratio if launch-bound",
        "ratio if compute-bound",
        "measured ratio",
    ]
    return harness.markdown_table(
        names,
        [
            [
                r["label"],
                r["arch"],
                f"{r['params'] / 1e6:.2f}M",
                *cells(r),
                f"{r['ratio_launch_bound']:.2f}",
                f"{r['ratio_compute_bound']:.2f}",
                f"{r['ratio_measured']:.2f}",
            ]
            for r in rows
        ],
        "ll" + "r" * (len(names) - 2),
    )


def get_parser():
    p = harness.parser(__doc__)
    p.add_argument("--phase", choices=[*PHASES, "all"], default="all")
    p.add_argument("--group", choices=[*GROUPS, "all"], default="all")
    p.add_argument(
        "--layers", type=int, default=6, help="encoder and decoder layers of every system"
    )
    p.add_argument("--embed-dim", type=int, default=512)
    p.add_argument("--ffn-dim", type=int, default=2048, help="Transformers' FFN width")
    p.add_argument("--heads", type=int, default=8, help="Transformers' attention heads")
    p.add_argument("--hidden", type=int, default=512, help="recurrent systems' cell width")
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--gen-batch", type=int, default=16, help="sentences decoded at once")
    p.add_argument("--src-len", type=int, default=24, help="source length of the decoded sentences")
    p.add_argument("--gen-len", type=int, default=24, help="forced output length (min = max)")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--train-batch", type=int, default=32, help="sentences of the training batch")
    p.add_argument(
        "--train-len", type=int, default=24, help="source and target length of the training batch"
    )
    harness.add_rounds(p, 5, flag="--repeats", help="timed rounds, the systems alternated (median)")
    harness.add_threads(p, 0, "torch intra-op threads (0: torch's default)")
    p.add_argument("--seed", type=int, default=1)
    harness.add_json(p, "")
    p.add_argument(
        "--profile",
        metavar="FILE",
        help="also profile one more step of each system (torch.profiler: the operators of most "
        "self time, on the GPU where it runs on one), appended to FILE",
    )
    add_device_argument(
        p, note="The counts are the same on either device; the measured ratio is the device's."
    )
    return p


def main(argv=None):
    a = get_parser().parse_args(argv)
    device_from_args(a)
    harness.set_threads(a.threads)
    results = {}
    for phase in PHASES if a.phase == "all" else [a.phase]:
        for name in GROUPS if a.group == "all" else [a.group]:
            rows = results.setdefault(phase, {})[name] = run_group(name, a, phase)
            width = (
                f"d={a.embed_dim}, ffn {a.ffn_dim}, {a.heads} heads"
                if GROUPS[name][2] is transformer_argv
                else f"embed {a.embed_dim}, cells {a.hidden}"
            )
            what = (
                f"{a.gen_batch} sentences x beam {a.beam}, {rows[0]['steps']} steps; per decoding step"
                if phase == "decode"
                else f"a batch of {a.train_batch} x {a.train_len} tokens; per training step (forward + backward)"
            )
            print(
                f"\n### {phase}, {name}: {a.layers}+{a.layers} layers, {width}, vocab {a.vocab}; {what}; "
                f"{describe(a.device)}, torch threads {torch.get_num_threads()}\n"
            )
            print(table(rows), flush=True)
            if a.json:  # after every group: a run cut short keeps what it measured
                harness.write_json(
                    a.json, {"args": {k: str(v) for k, v in vars(a).items()}, "results": results}
                )
    return results


if __name__ == "__main__":
    main()
