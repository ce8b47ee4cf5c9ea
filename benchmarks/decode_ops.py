"""What one beam-search decoding step costs, counted: operators, kernel launches, host syncs, FLOPs.

    python benchmarks/decode_ops.py --group aggregation    # Dou et al.'s rows 1-7 against row 1
    python benchmarks/decode_ops.py --group recurrent      # rnmt_plus, deep_att_ff against fairseq's lstm
    python benchmarks/decode_ops.py --group all --json ops.json

A decoding step's time has two floors.  At the small batches of beam search on a GPU each operator
costs about its launch, a few microseconds whatever its size, so the step is *launch-bound* and time
follows the number of kernels; at large batches, or on a CPU at paper width, the step is
*compute-bound* and time follows the FLOPs.  This script runs fairseq's ``SequenceGenerator`` (beam
``--beam``, output length forced to ``--gen-len``) once under a ``TorchDispatchMode`` that sees every
ATen operator and once under torch's ``FlopCounterMode``, and splits what it saw into the encoder
(once per batch), the decoder's steps, the beam's reordering of the incremental state and the
rest (the generator's own bookkeeping), per decoding step:

* ``ops``: every ATen operator call;
* ``kernels``: the calls that compute (all but views, metadata and allocations without a fill):
  on a GPU each is (at least) one kernel launch;
* ``syncs``: calls that make the host wait for the device (``.item()``, ``bool(tensor)``,
  ``nonzero``, ``masked_select``): each stalls the launch queue on a GPU;
* ``MFLOP``: FLOPs of matrix products (fairseq's counter: mm, bmm, addmm, baddbmm, attention);

then the *predicted* speed ratios of each system to its reference, ``kernels`` (launch-bound) and
``FLOPs`` (compute-bound) of a whole step, beside the measured one (tokens/s, median of
``--repeats`` generations on ``--device``, the systems alternated round by round).  The counts do not depend on the device (the same
ATen calls on CPU and GPU; cuBLAS may split a product into more than one kernel), so the floors can
be read off a CPU run; the measured ratio needs the device it claims.
"""

import argparse
import collections
import json
import os
import statistics
import sys
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
for path in (REPO, HERE):
    if path not in sys.path:
        sys.path.insert(0, path)

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402
from fairseq import options, tasks  # noqa: E402
from fairseq.data import Dictionary  # noqa: E402
from fairseq.sequence_generator import SequenceGenerator  # noqa: E402

import fairseq_deep  # noqa: E402,F401  (registers the architectures)
from _device import add_device_argument, clock, describe, device_from_args, parse_flags  # noqa: E402

#: operators that launch nothing: views, metadata, allocations without a fill
NO_KERNEL = frozenset("""
    view _unsafe_view reshape _reshape_alias transpose t permute slice select unsqueeze squeeze expand
    expand_as view_as split split_with_sizes unsafe_split chunk unbind alias as_strided detach narrow
    movedim lift_fresh empty new_empty empty_like empty_strided _local_scalar_dense sym_size sym_stride
    sym_numel sym_storage_offset is_same_size diagonal real imag _to_copy_noop
""".split())
#: operators that make the host wait for the device
SYNCS = frozenset("_local_scalar_dense nonzero masked_select is_nonzero".split())

SECTIONS = ("encoder", "decoder", "reorder", "generator")


class OpCounter(TorchDispatchMode):
    """Counts ATen calls by section (``section`` is set by the wrappers of :func:`instrument`)."""

    def __init__(self):
        super().__init__()
        self.section = "generator"
        self.ops: Dict[str, collections.Counter] = {s: collections.Counter() for s in SECTIONS}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[self.section][func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))

    def totals(self, section: str) -> Dict[str, int]:
        c = self.ops[section]
        return {"ops": sum(c.values()),
                "kernels": sum(n for name, n in c.items() if name not in NO_KERNEL),
                "syncs": sum(n for name, n in c.items() if name in SYNCS)}


class Sections:
    """Wraps a model's encoder, decoder and ``reorder_incremental_state_scripting`` so that a
    counter knows which of them is running, and counts the decoder's calls (the steps)."""

    def __init__(self, model):
        self.model, self.counter, self.steps = model, None, 0
        self.flops = {s: 0 for s in SECTIONS}
        self._flop_mode = None
        for section, owner, name in (("encoder", model.encoder, "forward"), ("decoder", model.decoder, "forward"),
                                     ("reorder", model.decoder, "reorder_incremental_state_scripting")):
            setattr(owner, name, self._wrap(section, getattr(owner, name)))

    def _wrap(self, section, fn):
        def wrapped(*args, **kwargs):
            if section == "decoder":
                self.steps += 1
            if self.counter is None and self._flop_mode is None:
                return fn(*args, **kwargs)
            outer = self.counter.section if self.counter is not None else None
            if self.counter is not None:
                self.counter.section = section
            before = self._flop_mode.get_total_flops() if self._flop_mode is not None else 0
            try:
                return fn(*args, **kwargs)
            finally:
                if self._flop_mode is not None:
                    self.flops[section] += self._flop_mode.get_total_flops() - before
                if self.counter is not None:
                    self.counter.section = outer
        return wrapped

    def count(self, generate) -> OpCounter:
        self.steps, self.counter = 0, OpCounter()
        try:
            with self.counter:
                generate()
        finally:
            counter, self.counter = self.counter, None
        return counter

    def count_flops(self, generate) -> Dict[str, int]:
        self.flops = {s: 0 for s in SECTIONS}
        with FlopCounterMode(display=False) as mode:
            self._flop_mode = mode
            try:
                generate()
            finally:
                self._flop_mode = None
            total = mode.get_total_flops()
        self.flops["generator"] = total - sum(self.flops[s] for s in SECTIONS if s != "generator")
        return dict(self.flops)


def dictionary(size: int) -> Dictionary:
    d = Dictionary()
    for i in range(size - d.nspecial):
        d.add_symbol(f"w{i}")
    return d


def build(argv: List[str], d: Dictionary, device, seed: int = 1):
    args = options.parse_args_and_arch(options.get_training_parser(),
                                       ["dummy", "--task", "translation", *parse_flags(device), *argv])
    task = tasks.translation.TranslationTask(args, d, d)
    torch.manual_seed(seed)
    return task.build_model(args).to(device).eval()


def transformer_argv(arch: str, a) -> List[str]:
    L, E, F, H = (str(v) for v in (a.layers, a.embed_dim, a.ffn_dim, a.heads))
    return ["--arch", arch, "--encoder-layers", L, "--decoder-layers", L, "--encoder-embed-dim", E,
            "--decoder-embed-dim", E, "--encoder-ffn-embed-dim", F, "--decoder-ffn-embed-dim", F,
            "--encoder-attention-heads", H, "--decoder-attention-heads", H, "--share-all-embeddings"]


def recurrent_argv(arch: str, a) -> List[str]:
    L, E, H = str(a.layers), str(a.embed_dim), str(a.hidden)
    argv = ["--arch", arch, "--encoder-layers", L, "--decoder-layers", L, "--encoder-embed-dim", E,
            "--decoder-embed-dim", E, "--encoder-hidden-size", H, "--decoder-hidden-size", H]
    if arch == "lstm":  # fairseq's: bidirectional encoder, attention, output width E
        argv += ["--encoder-bidirectional", "--decoder-out-embed-dim", E, "--adaptive-softmax-cutoff", "0"]
    return argv


#: group: (reference --arch, [(label, --arch)], argv builder)
GROUPS = {
    "aggregation": ("transformer_agg_baseline", [
        ("1 baseline", "transformer_agg_baseline"), ("2 dense", "transformer_dense"),
        ("3 linear", "transformer_linear_agg"), ("4 iterative", "transformer_iterative_agg"),
        ("5 hierarchical", "transformer_hier_agg"), ("6 MLA k=2", "transformer_mla2"),
        ("7 MLA k=3", "transformer_mla3")], transformer_argv),
    "recurrent": ("lstm", [("fairseq lstm", "lstm"), ("RNMT+", "rnmt_plus"), ("Deep-Att F-F", "deep_att_ff")],
                  recurrent_argv),
}


def counted(model, d: Dictionary, a):
    """Counts of one forced-length beam search of ``--gen-batch`` random sentences, and the
    generation itself (a function returning the number of tokens) for the timed rounds."""
    g = torch.Generator().manual_seed(a.seed)
    src = torch.randint(d.nspecial, len(d), (a.gen_batch, a.src_len), generator=g)
    src[:, -1] = d.eos()
    sample = {"net_input": {"src_tokens": src.to(a.device),
                            "src_lengths": torch.full((a.gen_batch,), a.src_len).to(a.device)}}
    gen = SequenceGenerator([model], d, beam_size=a.beam, max_len_a=0, max_len_b=a.gen_len, min_len=a.gen_len)
    sections = Sections(model)

    def generate() -> int:
        with torch.no_grad():
            return sum(len(h[0]["tokens"]) for h in gen.forward(sample))

    generate()  # warm-up: TorchScript profiling runs, allocator
    counter = sections.count(generate)
    steps = sections.steps
    flops = sections.count_flops(generate)
    per_step = {s: {k: v / steps for k, v in counter.totals(s).items()} for s in SECTIONS if s != "encoder"}
    row = {"steps": steps, "encoder": counter.totals("encoder"), "per_step": per_step,
           "step_kernels": sum(per_step[s]["kernels"] for s in per_step),
           "step_syncs": sum(per_step[s]["syncs"] for s in per_step),
           "step_mflop": sum(flops[s] for s in SECTIONS if s != "encoder") / steps / 1e6,
           "decoder_mflop": flops["decoder"] / steps / 1e6, "encoder_mflop": flops["encoder"] / 1e6,
           "params": sum(p.numel() for p in model.parameters()),
           "decoder_ops": dict(counter.ops["decoder"])}
    return row, generate


def run_group(name: str, a) -> List[Dict[str, object]]:
    """Counts every system of the group, then times their generations in alternated rounds
    (A B C ... A B C ...: a slow moment of the machine hits every system alike)."""
    reference, systems, argv_of = GROUPS[name]
    d = dictionary(a.vocab)
    rows, generators = [], []
    for label, arch in systems:
        row, generate = counted(build(argv_of(arch, a), d, a.device, a.seed), d, a)
        row.update(label=label, arch=arch, group=name, seconds=[])
        rows.append(row)
        generators.append(generate)
        print(f"[decode_ops] {label}: {row['step_kernels']:.0f} kernels, {row['step_syncs']:.1f} syncs, "
              f"{row['step_mflop']:.1f} MFLOP a step", file=sys.stderr, flush=True)
    for _ in range(a.repeats):
        for row, generate in zip(rows, generators):
            start = clock(a.device)
            row["tokens"] = generate()
            row["seconds"].append(clock(a.device) - start)
    for row in rows:
        row["tokens_per_s"] = row["tokens"] / statistics.median(row["seconds"])
    ref = next(r for r in rows if r["arch"] == reference)
    for r in rows:
        r["ratio_launch_bound"] = ref["step_kernels"] / r["step_kernels"]
        r["ratio_compute_bound"] = ref["step_mflop"] / r["step_mflop"]
        r["ratio_measured"] = r["tokens_per_s"] / ref["tokens_per_s"]
    return rows


def table(rows: List[Dict[str, object]]) -> str:
    head = ("| system | `--arch` | params | decoder kernels | reorder kernels | generator kernels | syncs "
            "| MFLOP | ratio if launch-bound | ratio if compute-bound | measured ratio |")
    lines = [head, "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        s = r["per_step"]
        lines.append(f"| {r['label']} | {r['arch']} | {r['params'] / 1e6:.2f}M | {s['decoder']['kernels']:.0f} "
                     f"| {s['reorder']['kernels']:.0f} | {s['generator']['kernels']:.0f} | {r['step_syncs']:.1f} "
                     f"| {r['step_mflop']:.1f} | {r['ratio_launch_bound']:.2f} | {r['ratio_compute_bound']:.2f} "
                     f"| {r['ratio_measured']:.2f} |")
    return "\n".join(lines)


def get_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--group", choices=[*GROUPS, "all"], default="all")
    p.add_argument("--layers", type=int, default=6, help="encoder and decoder layers of every system")
    p.add_argument("--embed-dim", type=int, default=512)
    p.add_argument("--ffn-dim", type=int, default=2048, help="Transformers' FFN width")
    p.add_argument("--heads", type=int, default=8, help="Transformers' attention heads")
    p.add_argument("--hidden", type=int, default=512, help="recurrent systems' cell width")
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--gen-batch", type=int, default=16, help="sentences decoded at once")
    p.add_argument("--src-len", type=int, default=24)
    p.add_argument("--gen-len", type=int, default=24, help="forced output length (min = max)")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--repeats", type=int, default=5, help="timed rounds, the systems alternated (median)")
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", default="")
    add_device_argument(p, note="The counts are the same on either device; the measured ratio is the device's.")
    return p


def main(argv=None):
    a = get_parser().parse_args(argv)
    device_from_args(a)
    if a.threads:
        torch.set_num_threads(a.threads)
    results = {}
    for name in (GROUPS if a.group == "all" else [a.group]):
        rows = results[name] = run_group(name, a)
        width = (f"d={a.embed_dim}, ffn {a.ffn_dim}, {a.heads} heads" if name == "aggregation"
                 else f"embed {a.embed_dim}, cells {a.hidden}")
        print(f"\n### {name}: {a.layers}+{a.layers} layers, {width}, vocab {a.vocab}; {a.gen_batch} sentences "
              f"x beam {a.beam}, {rows[0]['steps']} steps; per decoding step; {describe(a.device)}, "
              f"torch threads {torch.get_num_threads()}\n")
        print(table(rows))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": {k: str(v) for k, v in vars(a).items()}, "groups": results}, f, indent=1)
    return results


if __name__ == "__main__":
    main()
