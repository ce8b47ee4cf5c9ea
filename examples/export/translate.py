"""Translate with a model exported by ``fairseq-deep-export`` (``--format ctranslate2``), with the
settings that give fairseq-generate's hypotheses (docs/export.md).

    python examples/export/translate.py OUT [--spm spm.model] [--beam 5] [--lenpen 1.0]
        [--max-len-a 0] [--max-len-b 200] [--batch 32] [--threads 2] [--device cpu|cuda]
        [--compute-type TYPE] < input > output

With ``--spm``: raw sentences in, detokenized translations out (the sentencepiece model the data was
prepared with, e.g. ``fairseq-deep-prepare``'s ``DESTDIR/spm.model``); without: the pieces in and
out, one sentence per line, exactly as they stand in the data.  ``--max-len-a A --max-len-b B``
is fairseq-generate's length limit (A x the batch's longest source + B; the recipes use 1.2 and
10): the sentences are sorted by length and each batch of ``--batch`` gets its own
``max_decoding_length`` (``fairseq_deep.serving.translate``).  ``--compute-type``: the one
``fairseq-deep-export`` found fastest on this machine (its summary, ``OUT/fairseq_deep_export.json``).
"""

import argparse
import sys
import warnings

import ctranslate2


def _import_quietly():
    """``fairseq_deep.serving.translate``, without the warnings a normal run keeps off its output
    (``fairseq_deep.quiet``: importing the package imports fairseq, whose import of fairscale warns
    that ``torch.cuda.amp.custom_fwd`` is deprecated).  The filters come with the package, so the
    warnings of its import are caught and shown after it, but for those the filters drop
    (``PYTHONWARNINGS`` or ``-W`` still apply first)."""
    with warnings.catch_warnings(record=True) as caught:
        from fairseq_deep.quiet import quiet_warnings
        from fairseq_deep.serving import translate
    quiet_warnings()
    for w in caught:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
    return translate


translate = _import_quietly()


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("model", help="the folder fairseq-deep-export wrote")
    p.add_argument("--spm", help="sentencepiece model: raw text in, detokenized text out")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--lenpen", type=float, default=1.0)
    p.add_argument("--max-len-a", type=float, default=0.0)
    p.add_argument("--max-len-b", type=int, default=200)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--compute-type", default="default", help="CTranslate2's (default: the model's)")
    a = p.parse_args(argv)
    lines = sys.stdin.read().splitlines()
    if a.spm:
        import sentencepiece

        sp = sentencepiece.SentencePieceProcessor(model_file=a.spm)
        pieces = sp.encode(lines, out_type=str)
    else:
        pieces = [line.split() for line in lines]
    translator = ctranslate2.Translator(
        a.model, device=a.device, compute_type=a.compute_type, intra_threads=a.threads
    )
    hypotheses = translate(
        translator,
        pieces,
        beam=a.beam,
        lenpen=a.lenpen,
        max_len_a=a.max_len_a,
        max_len_b=a.max_len_b,
        max_batch_size=a.batch,
    )
    for tokens in hypotheses:
        print(sp.decode(tokens) if a.spm else " ".join(tokens))


if __name__ == "__main__":
    main()
