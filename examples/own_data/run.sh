#!/usr/bin/env bash
# Your own parallel text to a trained deep model, translations and sacreBLEU, in one script.
#
#   SRC=de TGT=en RAW=path/to/raw bash examples/own_data/run.sh [ARCH] [extra fairseq-train flags]
#
# RAW holds train.SRC, train.TGT, valid.*, test.* (plain or .gz), one raw sentence per line.
# ARCH: any architecture of the package (default transformer_dlcl; `fairseq-deep-train --arch X
# --help` lists its options).  Settings by environment: WORK (output folder, default own_data_run),
# VOCAB (joint sentencepiece size, 8000), MAX_UPDATE (20000), MAX_TOKENS (4096), LR (1e-3),
# WARMUP (4000), BEAM (5), PRECISION (e.g. --fp16 or --bf16 on a GPU; empty on CPU),
# DEVICE (--cpu on a machine without GPU, the default there).
set -euo pipefail
ARCH=${1:-transformer_dlcl}; shift || true
SRC=${SRC:?set SRC, the source language suffix}
TGT=${TGT:?set TGT, the target language suffix}
RAW=${RAW:?set RAW, the folder with train/valid/test files}
WORK=${WORK:-own_data_run}
VOCAB=${VOCAB:-8000}
MAX_UPDATE=${MAX_UPDATE:-20000}
MAX_TOKENS=${MAX_TOKENS:-4096}
LR=${LR:-1e-3}
WARMUP=${WARMUP:-4000}
BEAM=${BEAM:-5}
PRECISION=${PRECISION:-}
if [ -z "${DEVICE+x}" ]; then
  DEVICE=$(python -c 'import torch; print("" if torch.cuda.is_available() else "--cpu")')
fi
mkdir -p "$WORK"

# 1. sentencepiece (joint) + fairseq-preprocess
fairseq-deep-prepare --source-lang "$SRC" --target-lang "$TGT" --trainpref "$RAW/train" \
  --validpref "$RAW/valid" --testpref "$RAW/test" --destdir "$WORK" --vocab-size "$VOCAB"

# 2. train
fairseq-deep-train "$WORK/data-bin" --arch "$ARCH" --share-all-embeddings \
  --optimizer adam --adam-betas '(0.9, 0.98)' --lr "$LR" --lr-scheduler inverse_sqrt --warmup-updates "$WARMUP" \
  --criterion label_smoothed_cross_entropy --label-smoothing 0.1 --max-tokens "$MAX_TOKENS" \
  --max-update "$MAX_UPDATE" --save-dir "$WORK/checkpoints" --no-epoch-checkpoints \
  --log-format simple --log-interval 100 $PRECISION $DEVICE "$@" | tee "$WORK/train.log"

# 3. translate the test set (detokenized by --post-process sentencepiece), in input order
fairseq-deep-generate "$WORK/data-bin" --path "$WORK/checkpoints/checkpoint_best.pt" --gen-subset test \
  --beam "$BEAM" --batch-size 128 --post-process sentencepiece $PRECISION $DEVICE > "$WORK/generate.out"
grep ^D- "$WORK/generate.out" | sed 's/^D-//' | sort -n | cut -f3 > "$WORK/test.hyp"

# 4. score against the raw references
ref="$RAW/test.$TGT"; [ -f "$ref" ] || { zcat "$ref.gz" > "$WORK/test.ref"; ref="$WORK/test.ref"; }
n_hyp=$(wc -l < "$WORK/test.hyp"); n_ref=$(wc -l < "$ref")
[ "$n_hyp" -eq "$n_ref" ] || { echo "error: $n_hyp hypotheses for $n_ref test sentences" >&2; exit 1; }
sacrebleu "$ref" -i "$WORK/test.hyp" -m bleu chrf -f text | tee "$WORK/score.txt"

# Interactive translation of raw input lines (sentencepiece applied and removed for you):
echo "fairseq-deep-interactive $WORK/data-bin --path $WORK/checkpoints/checkpoint_best.pt --source-lang $SRC" \
     "--target-lang $TGT --bpe sentencepiece --sentencepiece-model $WORK/spm.model $DEVICE"
