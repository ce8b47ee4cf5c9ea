"""Speed of the layer-normalized LSTM and of RNMT+, side by side with PyTorch and fairseq.

1. One LSTM layer, forward + backward: ``LayerNormLSTM`` (per-gate layer norm, TorchScript loop)
   against ``torch.nn.LSTM`` (fused kernel: oneDNN/native on CPU, cuDNN on a GPU) of the same size,
   uni- and bidirectional.
2. Whole models of similar size: ``rnmt_plus`` against fairseq's own ``lstm`` architecture (with a
   bidirectional encoder and attention): training target words/s (forward, backward, Adam step) and
   beam-search generation tokens/s (fairseq's SequenceGenerator, beam 4).

Every pair is measured interleaved (A, B, A, B, ...) in one process and reported as a ratio, so that
the ratios hold on a busy machine where absolute numbers do not.  Prints a markdown table.

    python -m benchmarks.rnmt_speed                # the README table (a few minutes)
    python -m benchmarks.rnmt_speed --quick        # smoke run (seconds)

``--device cuda`` (the default where torch sees a GPU) runs every model and batch on the GPU and
synchronizes it before every clock reading (``--threads`` then only sets torch's CPU threads);
float32 on either device.
"""

if __name__ == "__main__" and not __package__:  # run as a file, the package's imports would fail
    raise SystemExit(
        "benchmarks/rnmt_speed.py is a module of the benchmarks package: run it from the "
        "repository root as python -m benchmarks.rnmt_speed"
    )

import torch

from fairseq_deep.runs import recipes

from . import harness
from .harness import add_device_argument, describe, device_from_args


def interleaved(fa, fb, rounds, repeats, device="cpu"):
    """Seconds per call of ``fa`` and of ``fb``, timed interleaved after two warm-up calls of each
    (TorchScript profiling runs, allocator)."""
    t = harness.interleaved_seconds({"a": fa, "b": fb}, rounds, repeats, device, warmup=2)
    return t["a"], t["b"]


def bench_layer(hidden, batch, length, bidirectional, rounds, repeats, device="cpu"):
    from fairseq_deep.modules.recurrent.ln_lstm import LayerNormLSTM

    torch.manual_seed(0)
    ours = LayerNormLSTM(hidden, hidden, bidirectional=bidirectional).to(device)
    ref = torch.nn.LSTM(hidden, hidden, bidirectional=bidirectional).to(device)
    x = torch.randn(length, batch, hidden).to(device)

    def run(m):
        def f():
            m.zero_grad(set_to_none=True)
            m(x)[0].sum().backward()

        return f

    ta, tb = interleaved(run(ours), run(ref), rounds, repeats, device)
    tokens = length * batch
    return tokens / ta, tokens / tb


def model_flags(hidden, enc_layers, dec_layers):
    size, depth = recipes.rnn_size(hidden, hidden), recipes.layers(enc_layers, dec_layers)
    rnmt = [*size, *depth, *recipes.dropout("0.1")]
    lstm = [
        *size,
        "--decoder-out-embed-dim",
        str(hidden),
        *depth,
        "--encoder-bidirectional",
        *recipes.dropout("0.1"),
        "--adaptive-softmax-cutoff",
        "0",
    ]
    return rnmt, lstm


def bench_models(
    hidden, enc_layers, dec_layers, batch, length, vocab, rounds, repeats, device="cpu"
):
    from fairseq.sequence_generator import SequenceGenerator

    d = harness.dictionary(vocab)
    rnmt_flags, lstm_flags = model_flags(hidden, enc_layers, dec_layers)
    models = {
        name: harness.build_model(["--arch", arch, *flags], d, device, seed=0)
        for name, arch, flags in (
            ("rnmt_plus", "rnmt_plus", rnmt_flags),
            ("lstm", "lstm", lstm_flags),
        )
    }
    src, lengths, prev = harness.random_batch(
        d, bsz=batch, src_len=length, tgt_len=length, pad_last=False
    )
    target = torch.cat([prev[:, 1:], torch.full((batch, 1), d.eos())], 1)
    src, lengths, prev, target = (t.to(device) for t in (src, lengths, prev, target))

    def train_fn(model):
        opt = torch.optim.Adam(model.parameters(), lr=1e-4)
        model.train()

        def f():
            opt.zero_grad(set_to_none=True)
            logits = model(src, lengths, prev)[0]
            torch.nn.functional.cross_entropy(
                logits.view(-1, logits.size(-1)), target.reshape(-1)
            ).backward()
            opt.step()

        return f

    def gen_fn(model, counter):
        gen = SequenceGenerator(
            [model], d, beam_size=4, max_len_a=0, max_len_b=length, min_len=length
        )
        sample = {"net_input": {"src_tokens": src, "src_lengths": lengths}}

        def f():
            model.eval()
            with torch.no_grad():
                hyps = gen.generate([model], sample)
            counter[0] = sum(len(h[0]["tokens"]) for h in hyps)

        return f

    tr = interleaved(
        train_fn(models["rnmt_plus"]), train_fn(models["lstm"]), rounds, repeats, device
    )
    counts = [[0], [0]]
    ge = interleaved(
        gen_fn(models["rnmt_plus"], counts[0]),
        gen_fn(models["lstm"], counts[1]),
        rounds,
        repeats,
        device,
    )
    words = batch * length
    params = {k: sum(p.numel() for p in m.parameters()) for k, m in models.items()}
    return (words / tr[0], words / tr[1]), (counts[0][0] / ge[0], counts[1][0] / ge[1]), params


def get_parser():
    p = harness.parser(__doc__, full=True)
    harness.add_threads(p, torch.get_num_threads())
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--length", type=int, default=25)
    p.add_argument("--encoder-layers", type=int, default=2)
    p.add_argument("--decoder-layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=8000)
    harness.add_rounds(p, 5)
    harness.add_calls_per_round(p, 3)
    p.add_argument("--quick", action="store_true", help="tiny sizes, one round: a smoke run")
    add_device_argument(p)
    return p


def main(argv=None):
    a = get_parser().parse_args(argv)
    device_from_args(a)
    if a.quick:
        a.hidden, a.batch, a.length, a.vocab, a.rounds, a.repeats = 32, 4, 8, 100, 1, 1
    torch.set_num_threads(a.threads)

    rows = []
    for bi in (False, True):
        ours, ref = bench_layer(a.hidden, a.batch, a.length, bi, a.rounds, a.repeats, a.device)
        rows.append(
            (
                f"LSTM layer fwd+bwd, {'bi' if bi else 'uni'}directional, H={a.hidden} (tokens/s)",
                "LayerNormLSTM",
                ours,
                "torch.nn.LSTM",
                ref,
            )
        )
    tr, ge, params = bench_models(
        a.hidden,
        a.encoder_layers,
        a.decoder_layers,
        a.batch,
        a.length,
        a.vocab,
        a.rounds,
        a.repeats,
        a.device,
    )
    size = f"{a.encoder_layers}+{a.decoder_layers} layers, H={a.hidden}"
    rows.append((f"training, {size} (target words/s)", "rnmt_plus", tr[0], "fairseq lstm", tr[1]))
    rows.append(
        (f"generation, beam 4, {size} (tokens/s)", "rnmt_plus", ge[0], "fairseq lstm", ge[1])
    )

    print(
        f"torch {torch.__version__}, {a.threads} thread(s), batch {a.batch}, length {a.length}, "
        f"params rnmt_plus {params['rnmt_plus'] / 1e6:.1f}M / lstm {params['lstm'] / 1e6:.1f}M"
        + (f"; {describe(a.device)}" if a.device != "cpu" else "")
        + "\n"
    )
    print(
        harness.markdown_table(
            ["measurement", "ours", "ours", "reference", "reference", "ratio"],
            [
                [what, na, f"{va:,.0f}", nb, f"{vb:,.0f}", f"{va / vb:.2f}x"]
                for what, na, va, nb, vb in rows
            ],
            "llrlrr",
        )
    )


if __name__ == "__main__":
    main()
