"""Translate with a model exported by ``fairseq-deep-export`` (``--format ctranslate2``), with the
settings that give fairseq-generate's hypotheses (docs/export.md).

    python examples/export/translate.py OUT [--spm spm.model] [--beam 5] [--lenpen 1.0]
        [--max-len-a 0] [--max-len-b 200] [--batch 32] [--threads 2] [--device cpu|cuda]
        [--fastest] [--compute-type TYPE] [--inter-threads N] < input > output

With ``--spm``: raw sentences in, detokenized translations out (the sentencepiece model the data was
prepared with, e.g. ``fairseq-deep-prepare``'s ``DESTDIR/spm.model``); without: the pieces in and
out, one sentence per line, exactly as they stand in the data.  ``--max-len-a A --max-len-b B``
is fairseq-generate's length limit (A x the batch's longest source + B; the recipes use 1.2 and
10): the sentences are sorted by length and each batch of ``--batch`` gets its own
``max_decoding_length`` (``fairseq_deep.serving.translate``).  ``--fastest``: serve as
``fairseq-deep-export`` found fastest on this machine (``OUT/serving.json``: the backend, set as
``CT2_USE_MKL`` before ctranslate2 is imported, which reads it once; the compute type, intra/inter
threads and batch size), the options given here winning; without it, ``--compute-type`` (default:
the model's) on ``--threads`` threads in CTranslate2's default backend.
"""

import argparse
import sys
import warnings


def _import_quietly():
    """``fairseq_deep.serving.translate``, without the warnings a normal run keeps off its output
    (``fairseq_deep.quiet``: importing the package imports fairseq, whose import of fairscale warns
    that ``torch.cuda.amp.custom_fwd`` is deprecated).  The filters come with the package, so the
    warnings of its import are caught and shown after it, but for those the filters drop
    (``PYTHONWARNINGS`` or ``-W`` still apply first)."""
    with warnings.catch_warnings(record=True) as caught:
        from fairseq_deep import serving
        from fairseq_deep.quiet import quiet_warnings
    quiet_warnings()
    for w in caught:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
    return serving


serving = _import_quietly()  # ctranslate2 is imported later: after --fastest set its backend


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
    p.add_argument("--batch", type=int, help="sentences per batch (default: --fastest's, or 32)")
    p.add_argument("--threads", type=int, help="intra_threads (default: --fastest's, or 2)")
    p.add_argument("--inter-threads", type=int, help="batches at once (default: --fastest's, or 1)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--compute-type", help="CTranslate2's (default: --fastest's, or the model's)")
    p.add_argument(
        "--fastest",
        action="store_true",
        help="serve as fairseq-deep-export found fastest here (OUT/serving.json)",
    )
    a = p.parse_args(argv)
    lines = sys.stdin.read().splitlines()
    if a.spm:
        import sentencepiece

        sp = sentencepiece.SentencePieceProcessor(model_file=a.spm)
        pieces = sp.encode(lines, out_type=str)
    else:
        pieces = [line.split() for line in lines]
    choice = (serving.read_choice(a.model, a.device) if a.fastest else None) or {}
    if a.fastest and not choice:
        print(
            f"translate.py: {a.model} has no {serving.CHOICE} timed on {a.device} (exported with "
            "--no-timing, or elsewhere): CTranslate2's defaults",
            file=sys.stderr,
        )
    translator = serving.translator(  # sets --fastest's CT2_USE_MKL, then imports ctranslate2
        a.model,
        device=a.device,
        fastest=a.fastest,
        compute_type=a.compute_type or choice.get("compute_type", "default"),
        intra_threads=a.threads or choice.get("intra_threads", 2),
        inter_threads=a.inter_threads or choice.get("inter_threads", 1),
    )
    hypotheses = serving.translate(
        translator,
        pieces,
        beam=a.beam,
        lenpen=a.lenpen,
        max_len_a=a.max_len_a,
        max_len_b=a.max_len_b,
        max_batch_size=a.batch or choice.get("max_batch_size", 32),
        batch_type=choice.get("batch_type", "examples") if not a.batch else "examples",
    )
    for tokens in hypotheses:
        print(sp.decode(tokens) if a.spm else " ".join(tokens))


if __name__ == "__main__":
    main()
