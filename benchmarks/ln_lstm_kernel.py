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

    python -m benchmarks.ln_lstm_kernel                          # on a GPU: the issue 16 table
    python -m benchmarks.ln_lstm_kernel --cell ff                # the same for the Deep-Att cell
    python -m benchmarks.ln_lstm_kernel --device cpu --impls loop --sizes 10x8x64 --rounds 2

On a CPU the triton impl runs only in Triton's interpreter (``TRITON_INTERPRET=1``; far too slow to
time, useful only to see the script run at tiny sizes); without it the triton columns are skipped.
"""

if __name__ == "__main__" and not __package__:  # run as a file, the package's imports would fail
    raise SystemExit(
        "benchmarks/ln_lstm_kernel.py is a module of the benchmarks package: run it from the "
        "repository root as python -m benchmarks.ln_lstm_kernel"
    )

import argparse
import json
import os
import sys

import torch

from . import harness
from .harness import add_device_argument, device_from_args, interleaved_seconds

DEFAULT_SIZES = ["30x128x512", "50x64x1024"]


def parse_size(text):
    try:
        T, B, H = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--sizes takes TxBxH, e.g. 30x128x512; got {text!r}"
        ) from None
    return T, B, H


class DeepAttLayer(torch.nn.Module):
    """``FFLSTMLayer(H, H)`` (W_f and the Eq. 4 cell, forward) called and returning as nn.LSTM does:
    (h of every step, (h_T, s_T)); a state is (h, s), each B x H."""

    def __init__(self, H, impl):
        super().__init__()
        from fairseq_deep.modules.recurrent.fast_forward_lstm import FFLSTMLayer

        self.layer = FFLSTMLayer(H, H, impl=impl)
        with torch.no_grad():  # trained values instead of the paper's zero start (Sec. 4.3)
            self.layer.cell.weight_r.normal_(0, H**-0.5)
            self.layer.cell.theta.normal_(0, 0.1)

    def forward(self, x, state=None):
        _, h, state = self.layer(x, state=state)
        return h, state


def build(T, B, H, bidirectional, impls, device, cell="ln"):
    from fairseq_deep.modules.recurrent.ln_lstm import LayerNormLSTM

    torch.manual_seed(0)
    models = {"nn.LSTM": torch.nn.LSTM(H, H, bidirectional=bidirectional).to(device)}
    for impl in impls:
        torch.manual_seed(0)
        if cell == "ff":
            models[impl] = DeepAttLayer(H, impl).to(device)
        else:
            models[impl] = LayerNormLSTM(
                H, H, bidirectional=bidirectional, cell_clip=10.0, impl=impl
            ).to(device)
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
        with torch.no_grad(), torch.autocast(
            x_t.device.type, dtype=autocast, enabled=autocast is not None
        ):
            model(x_t, state) if isinstance(model, torch.nn.LSTM) else model(x_t, state=state)

    return run


def measure(T, B, H, bidirectional, precision, impls, device, args):
    autocast = None
    if precision == "autocast":
        autocast = torch.float16 if device.type == "cuda" else torch.bfloat16
    models = build(T, B, H, bidirectional, impls, device, args.cell)
    x = torch.randn(T, B, H, device=device, requires_grad=True)
    row = {"size": f"{T}x{B}x{H}", "dirs": "bi" if bidirectional else "uni", "precision": precision}
    fwd_bwd = interleaved_seconds(
        {name: train_step(m, x, autocast) for name, m in models.items()},
        args.rounds,
        args.repeats,
        device,
        args.warmup,
    )
    row["nn.LSTM fwd+bwd ms"] = 1e3 * fwd_bwd["nn.LSTM"]
    for impl in impls:
        row[f"{impl} fwd+bwd"] = fwd_bwd["nn.LSTM"] / fwd_bwd[impl]
    if not bidirectional:
        x_t = torch.randn(1, B, H, device=device)
        state = (torch.randn(1, B, H, device=device), torch.randn(1, B, H, device=device))
        states = {
            name: (state[0][0], state[1][0]) if isinstance(m, DeepAttLayer) else state
            for name, m in models.items()
        }
        step = interleaved_seconds(
            {name: infer_step(m, x_t, states[name], autocast) for name, m in models.items()},
            args.rounds,
            args.repeats * args.step_repeats,
            device,
            args.warmup,
        )
        row["nn.LSTM step ms"] = 1e3 * step["nn.LSTM"]
        for impl in impls:
            row[f"{impl} step"] = step["nn.LSTM"] / step[impl]
    return row


def markdown(rows, impls):
    cols = ["size", "dirs", "precision", "nn.LSTM fwd+bwd ms"] + [f"{i} fwd+bwd" for i in impls]
    cols += ["nn.LSTM step ms"] + [f"{i} step" for i in impls]
    lines = []
    for r in rows:
        cells = []
        for c in cols:
            v = r.get(c, "-")
            cells.append(
                f"{v:.2f}"
                if isinstance(v, float) and c.endswith("ms")
                else f"{v:.2f}x"
                if isinstance(v, float)
                else str(v)
            )
        lines.append(cells)
    return harness.markdown_table(
        [c.replace(" ms", " (ms)") for c in cols], lines, "lll" + "r" * (len(cols) - 3)
    )


def parse_args(argv=None):
    p = harness.parser(__doc__, full=True)
    add_device_argument(p)
    p.add_argument(
        "--cell",
        choices=["ln", "ff"],
        default="ln",
        help="ln: RNMT+'s LayerNormLSTM (--rnmt-lstm-impl); ff: one Deep-Att layer, FFLSTMLayer "
        "(--deep-att-cell-impl), unidirectional only",
    )
    p.add_argument(
        "--sizes",
        nargs="+",
        type=parse_size,
        default=[parse_size(s) for s in DEFAULT_SIZES],
        metavar="TxBxH",
        help=f"steps x batch x units (default: {' '.join(DEFAULT_SIZES)})",
    )
    p.add_argument("--directions", nargs="+", choices=["uni", "bi"], default=["uni", "bi"])
    p.add_argument(
        "--precisions", nargs="+", choices=["fp32", "autocast"], default=["fp32", "autocast"]
    )
    p.add_argument("--impls", nargs="+", choices=["loop", "triton"], default=["loop", "triton"])
    harness.add_rounds(p, 5)
    harness.add_calls_per_round(p, 5, "calls per round (the median is kept)")
    p.add_argument(
        "--step-repeats", type=int, default=10, help="the step is timed over repeats x this calls"
    )
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument(
        "--tf32",
        action="store_true",
        help="CUDA: let fp32 matmuls (ours and cuDNN's LSTM) use TF32; default off for both",
    )
    harness.add_threads(p, help="torch CPU threads")
    harness.add_json(p, help="also write the rows to this file")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    harness.set_threads(args.threads)
    device = device_from_args(args)
    impls = list(args.impls)
    if "triton" in impls and device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        print(
            "triton skipped: its kernels need CUDA (or TRITON_INTERPRET=1, the interpreter)",
            file=sys.stderr,
        )
        impls.remove("triton")
    if (
        device.type == "cuda"
    ):  # fp32 means fp32 (cuDNN's LSTM uses TF32 by default): --tf32 for both
        torch.backends.cuda.matmul.allow_tf32 = args.tf32
        torch.backends.cudnn.allow_tf32 = args.tf32
        name = torch.cuda.get_device_name(device)
    else:
        name = f"CPU, {torch.get_num_threads()} threads"
    directions = list(args.directions)
    if args.cell == "ff" and "bi" in directions:
        print(
            "--cell ff: unidirectional only (a Deep-Att layer runs one direction)", file=sys.stderr
        )
        directions = ["uni"]
    rows = []
    for T, B, H in args.sizes:
        for dirs in directions:
            for precision in args.precisions:
                row = measure(T, B, H, dirs == "bi", precision, impls, device, args)
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    what = "Deep-Att FFLSTMLayer" if args.cell == "ff" else "LayerNormLSTM"
    print(
        f"\n{what} / nn.LSTM speed (time(nn.LSTM) / time(impl); 1.00x = as fast), {name}, "
        f"torch {torch.__version__}\n"
    )
    print(markdown(rows, impls))
    if args.json:
        harness.write_json(
            args.json, {"device": name, "torch": torch.__version__, "cell": args.cell, "rows": rows}
        )


if __name__ == "__main__":
    main()
