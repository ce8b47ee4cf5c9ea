"""Speed of the layer-normalized LSTM and of RNMT+, side by side with PyTorch and fairseq.

1. One LSTM layer, forward + backward: ``LayerNormLSTM`` (per-gate layer norm, TorchScript loop)
   against ``torch.nn.LSTM`` (fused kernel: oneDNN/native on CPU, cuDNN on a GPU) of the same size,
   uni- and bidirectional.
2. Whole models of similar size: ``rnmt_plus`` against fairseq's own ``lstm`` architecture (with a
   bidirectional encoder and attention): training target words/s (forward, backward, Adam step) and
   beam-search generation tokens/s (fairseq's SequenceGenerator, beam 4).

Every pair is measured interleaved (A, B, A, B, ...) in one process and reported as a ratio, so that
the ratios hold on a busy machine where absolute numbers do not.  Prints a markdown table.

    python benchmarks/rnmt_speed.py                # the README table (a few minutes)
    python benchmarks/rnmt_speed.py --quick        # smoke run (seconds)

``--device cuda`` (the default where torch sees a GPU) runs every model and batch on the GPU and
synchronizes it before every clock reading (``--threads`` then only sets torch's CPU threads);
float32 on either device.
"""

import argparse
import os
import statistics
import sys

import torch

from _device import add_device_argument, describe, device_from_args, median_seconds, parse_flags

TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")


def interleaved(fa, fb, rounds, repeats, device="cpu"):
    fa(), fb()  # warm up (TorchScript profiling runs, allocator)
    fa(), fb()
    ta, tb = [], []
    for _ in range(rounds):
        ta.append(median_seconds(fa, repeats, device))
        tb.append(median_seconds(fb, repeats, device))
    return statistics.median(ta), statistics.median(tb)


def bench_layer(hidden, batch, length, bidirectional, rounds, repeats, device="cpu"):
    from fairseq_deep.modules.ln_lstm import LayerNormLSTM

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


def build(arch, flags, dictionary, device="cpu"):
    from fairseq import options, tasks

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, ["dummy", "--task", "translation", "--arch", arch,
                                                *parse_flags(device), *flags])
    task = tasks.translation.TranslationTask(args, dictionary, dictionary)
    torch.manual_seed(0)
    return task.build_model(args).to(device), task, args


def model_flags(hidden, enc_layers, dec_layers):
    h = str(hidden)
    rnmt = ["--encoder-embed-dim", h, "--decoder-embed-dim", h, "--encoder-hidden-size", h,
            "--decoder-hidden-size", h, "--encoder-layers", str(enc_layers), "--decoder-layers", str(dec_layers),
            "--dropout", "0.1"]
    lstm = ["--encoder-embed-dim", h, "--decoder-embed-dim", h, "--encoder-hidden-size", h,
            "--decoder-hidden-size", h, "--decoder-out-embed-dim", h, "--encoder-layers", str(enc_layers),
            "--decoder-layers", str(dec_layers), "--encoder-bidirectional", "--dropout", "0.1",
            "--adaptive-softmax-cutoff", "0"]
    return rnmt, lstm


def bench_models(hidden, enc_layers, dec_layers, batch, length, vocab, rounds, repeats, device="cpu"):
    from fairseq.sequence_generator import SequenceGenerator

    sys.path.insert(0, TESTS)
    from helpers import random_batch, tiny_dictionary

    d = tiny_dictionary(vocab)
    rnmt_flags, lstm_flags = model_flags(hidden, enc_layers, dec_layers)
    models = {name: build(arch, flags, d, device) for name, arch, flags in
              (("rnmt_plus", "rnmt_plus", rnmt_flags), ("lstm", "lstm", lstm_flags))}
    src, lengths, prev = random_batch(d, bsz=batch, src_len=length, tgt_len=length, pad_last=False)
    target = torch.cat([prev[:, 1:], torch.full((batch, 1), d.eos())], 1)
    src, lengths, prev, target = (t.to(device) for t in (src, lengths, prev, target))

    def train_fn(model):
        opt = torch.optim.Adam(model.parameters(), lr=1e-4)
        model.train()

        def f():
            opt.zero_grad(set_to_none=True)
            logits = model(src, lengths, prev)[0]
            torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), target.reshape(-1)).backward()
            opt.step()
        return f

    def gen_fn(model, counter):
        gen = SequenceGenerator([model], d, beam_size=4, max_len_a=0, max_len_b=length, min_len=length)
        sample = {"net_input": {"src_tokens": src, "src_lengths": lengths}}

        def f():
            model.eval()
            with torch.no_grad():
                hyps = gen.generate([model], sample)
            counter[0] = sum(len(h[0]["tokens"]) for h in hyps)
        return f

    tr = interleaved(train_fn(models["rnmt_plus"][0]), train_fn(models["lstm"][0]), rounds, repeats, device)
    counts = [[0], [0]]
    ge = interleaved(gen_fn(models["rnmt_plus"][0], counts[0]), gen_fn(models["lstm"][0], counts[1]), rounds, repeats,
                     device)
    words = batch * length
    params = {k: sum(p.numel() for p in m[0].parameters()) for k, m in models.items()}
    return (words / tr[0], words / tr[1]), (counts[0][0] / ge[0], counts[1][0] / ge[1]), params


def get_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--length", type=int, default=25)
    p.add_argument("--encoder-layers", type=int, default=2)
    p.add_argument("--decoder-layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3)
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
        rows.append((f"LSTM layer fwd+bwd, {'bi' if bi else 'uni'}directional, H={a.hidden} (tokens/s)",
                     "LayerNormLSTM", ours, "torch.nn.LSTM", ref))
    tr, ge, params = bench_models(a.hidden, a.encoder_layers, a.decoder_layers, a.batch, a.length, a.vocab,
                                  a.rounds, a.repeats, a.device)
    size = f"{a.encoder_layers}+{a.decoder_layers} layers, H={a.hidden}"
    rows.append((f"training, {size} (target words/s)", "rnmt_plus", tr[0], "fairseq lstm", tr[1]))
    rows.append((f"generation, beam 4, {size} (tokens/s)", "rnmt_plus", ge[0], "fairseq lstm", ge[1]))

    print(f"torch {torch.__version__}, {a.threads} thread(s), batch {a.batch}, length {a.length}, "
          f"params rnmt_plus {params['rnmt_plus'] / 1e6:.1f}M / lstm {params['lstm'] / 1e6:.1f}M"
          + (f"; {describe(a.device)}" if a.device != "cpu" else "") + "\n")
    print("| measurement | ours | ours | reference | reference | ratio |")
    print("| --- | --- | ---: | --- | ---: | ---: |")
    for what, na, va, nb, vb in rows:
        print(f"| {what} | {na} | {va:,.0f} | {nb} | {vb:,.0f} | {va / vb:.2f}x |")


if __name__ == "__main__":
    main()
