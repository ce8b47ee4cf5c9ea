"""One layer-normalized LSTM layer against torch.nn.LSTM (cuDNN on a GPU): the loop and the fused
Triton kernels (``--rnmt-lstm-impl loop|triton``, issue 16); with ``--cell ff`` one Deep-Att /
Deep-ED layer instead (``FFLSTMLayer``: W_f for all steps, then the cell of Zhou et al. 2016, Eq. 4;
``--deep-att-cell-impl loop|triton``), unidirectional only (each Deep-Att layer runs one direction).

For each size T x B x H (steps x batch x units, input width H), direction (uni, bi) and precision
(fp32; autocast: float16 on CUDA, bfloat16 on CPU) it times

* **fwd+bwd**: one layer's forward and backward (input, weights and layer-norm parameters get
  gradients), as in training;
* **step**: one step of inference from a given state (``layer(x_t, state=...)`` under
  ``no_grad``, the input projection included), as the RNMT+ decoder's bottom layer (and Deep-Att's
  decoder layer 1) runs it in beam search: unidirectional only,

for ``torch.nn.LSTM`` of the same size and for ``LayerNormLSTM`` (``--cell ff``: the Deep-Att layer,
random W_r and theta) with each ``--impls`` entry, in one
process, interleaved (nn.LSTM, loop, triton, nn.LSTM, ...), medians over ``--rounds``; on CUDA the
GPU is synchronized before every clock reading.  It prints a markdown table of speed ratios
time(nn.LSTM) / time(impl): 1.0 is as fast as nn.LSTM, 0.25 four times slower.

    python benchmarks/ln_lstm_kernel.py                          # on a GPU: the issue 16 table
    python benchmarks/ln_lstm_kernel.py --cell ff                # the same for the Deep-Att cell
    python benchmarks/ln_lstm_kernel.py --device cpu --impls loop --sizes 10x8x64 --rounds 2

On a CPU the triton impl runs only in Triton's interpreter (``TRITON_INTERPRET=1``; far too slow to
time, useful only to see the script run at tiny sizes); without it the triton columns are skipped.
"""

import argparse
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _device import add_device_argument, clock, device_from_args, median_seconds  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DEFAULT_SIZES = ["30x128x512", "50x64x1024"]


def parse_size(text):
    try:
        T, B, H = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--sizes takes TxBxH, e.g. 30x128x512; got {text!r}")
    return T, B, H


def interleaved(fns, device, rounds, repeats, warmup):
    """{name: median seconds per call} over ``rounds`` rounds, each calling every fn in turn."""
    for fn in fns.values():  # warm up: TorchScript profiling runs, Triton compilation, cuDNN plans
        for _ in range(warmup):
            fn()
    clock(device)  # waits for the warm-up's kernels
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(median_seconds(fn, repeats, device))
    return {name: statistics.median(ts) for name, ts in times.items()}


class DeepAttLayer(torch.nn.Module):
    """``FFLSTMLayer(H, H)`` (W_f and the Eq. 4 cell, forward) called and returning as nn.LSTM does:
    (h of every step, (h_T, s_T)); a state is (h, s), each B x H."""

    def __init__(self, H, impl):
        super().__init__()
        from fairseq_deep.modules.fast_forward_lstm import FFLSTMLayer

        self.layer = FFLSTMLayer(H, H, impl=impl)
        with torch.no_grad():  # trained values instead of the paper's zero start (Sec. 4.3)
            self.layer.cell.weight_r.normal_(0, H ** -0.5)
            self.layer.cell.theta.normal_(0, 0.1)

    def forward(self, x, state=None):
        _, h, state = self.layer(x, state=state)
        return h, state


def build(T, B, H, bidirectional, impls, device, cell="ln"):
    from fairseq_deep.modules.ln_lstm import LayerNormLSTM

    torch.manual_seed(0)
    models = {"nn.LSTM": torch.nn.LSTM(H, H, bidirectional=bidirectional).to(device)}
    for impl in impls:
        torch.manual_seed(0)
        if cell == "ff":
            models[impl] = DeepAttLayer(H, impl).to(device)
        else:
            models[impl] = LayerNormLSTM(H, H, bidirectional=bidirectional, cell_clip=10.0, impl=impl).to(device)
    return models


def train_step(model, x, autocast):
    def run():
        model.zero_grad(set_to_none=True)
        x.grad = None
        with torch.autocast(x.device.type, dtype=autocast, enabled=autocast is not None):
            out = model(x)[0]
        out.float().sum().backward()
    return run


def infer_step(model, x_t, state, autocast):
    def run():
        with torch.no_grad(), torch.autocast(x_t.device.type, dtype=autocast, enabled=autocast is not None):
            model(x_t, state) if isinstance(model, torch.nn.LSTM) else model(x_t, state=state)
    return run


def measure(T, B, H, bidirectional, precision, impls, device, args):
    autocast = None
    if precision == "autocast":
        autocast = torch.float16 if device.type == "cuda" else torch.bfloat16
    models = build(T, B, H, bidirectional, impls, device, args.cell)
    x = torch.randn(T, B, H, device=device, requires_grad=True)
    row = {"size": f"{T}x{B}x{H}", "dirs": "bi" if bidirectional else "uni", "precision": precision}
    fwd_bwd = interleaved({name: train_step(m, x, autocast) for name, m in models.items()}, device,
                          args.rounds, args.repeats, args.warmup)
    row["nn.LSTM fwd+bwd ms"] = 1e3 * fwd_bwd["nn.LSTM"]
    for impl in impls:
        row[f"{impl} fwd+bwd"] = fwd_bwd["nn.LSTM"] / fwd_bwd[impl]
    if not bidirectional:
        x_t = torch.randn(1, B, H, device=device)
        state = (torch.randn(1, B, H, device=device), torch.randn(1, B, H, device=device))
        states = {name: (state[0][0], state[1][0]) if isinstance(m, DeepAttLayer) else state
                  for name, m in models.items()}
        step = interleaved({name: infer_step(m, x_t, states[name], autocast) for name, m in models.items()}, device,
                           args.rounds, args.repeats * args.step_repeats, args.warmup)
        row["nn.LSTM step ms"] = 1e3 * step["nn.LSTM"]
        for impl in impls:
            row[f"{impl} step"] = step["nn.LSTM"] / step[impl]
    return row


def markdown(rows, impls):
    cols = ["size", "dirs", "precision", "nn.LSTM fwd+bwd ms"] + [f"{i} fwd+bwd" for i in impls]
    cols += ["nn.LSTM step ms"] + [f"{i} step" for i in impls]
    lines = ["| " + " | ".join(c.replace(" ms", " (ms)") for c in cols) + " |",
             "| " + " | ".join("---" if i < 3 else "---:" for i in range(len(cols))) + " |"]
    for r in rows:
        cells = []
        for c in cols:
            v = r.get(c, "-")
            cells.append(f"{v:.2f}" if isinstance(v, float) and c.endswith("ms") else
                         f"{v:.2f}x" if isinstance(v, float) else str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_device_argument(p)
    p.add_argument("--cell", choices=["ln", "ff"], default="ln",
                   help="ln: RNMT+'s LayerNormLSTM (--rnmt-lstm-impl); ff: one Deep-Att layer, FFLSTMLayer "
                        "(--deep-att-cell-impl), unidirectional only")
    p.add_argument("--sizes", nargs="+", type=parse_size, default=[parse_size(s) for s in DEFAULT_SIZES],
                   metavar="TxBxH", help=f"steps x batch x units (default: {' '.join(DEFAULT_SIZES)})")
    p.add_argument("--directions", nargs="+", choices=["uni", "bi"], default=["uni", "bi"])
    p.add_argument("--precisions", nargs="+", choices=["fp32", "autocast"], default=["fp32", "autocast"])
    p.add_argument("--impls", nargs="+", choices=["loop", "triton"], default=["loop", "triton"])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeats", type=int, default=5, help="calls per round (the median is kept)")
    p.add_argument("--step-repeats", type=int, default=10, help="the step is timed over repeats x this calls")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--tf32", action="store_true",
                   help="CUDA: let fp32 matmuls (ours and cuDNN's LSTM) use TF32; default off for both")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--json", default=None, help="also write the rows to this file")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = device_from_args(args)
    impls = list(args.impls)
    if "triton" in impls and device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        print("triton skipped: its kernels need CUDA (or TRITON_INTERPRET=1, the interpreter)", file=sys.stderr)
        impls.remove("triton")
    if device.type == "cuda":  # fp32 means fp32 (cuDNN's LSTM uses TF32 by default): --tf32 for both
        torch.backends.cuda.matmul.allow_tf32 = args.tf32
        torch.backends.cudnn.allow_tf32 = args.tf32
        name = torch.cuda.get_device_name(device)
    else:
        name = f"CPU, {torch.get_num_threads()} threads"
    directions = list(args.directions)
    if args.cell == "ff" and "bi" in directions:
        print("--cell ff: unidirectional only (a Deep-Att layer runs one direction)", file=sys.stderr)
        directions = ["uni"]
    rows = []
    for T, B, H in args.sizes:
        for dirs in directions:
            for precision in args.precisions:
                row = measure(T, B, H, dirs == "bi", precision, impls, device, args)
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    what = "Deep-Att FFLSTMLayer" if args.cell == "ff" else "LayerNormLSTM"
    print(f"\n{what} / nn.LSTM speed (time(nn.LSTM) / time(impl); 1.00x = as fast), {name}, "
          f"torch {torch.__version__}\n")
    print(markdown(rows, impls))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "torch": torch.__version__, "cell": args.cell, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
