#!/usr/bin/env bash
# From a trained model to a served one: fairseq-deep-export to fairseq's own transformer and to
# CTranslate2 (float32 and int8), plain fairseq-generate on the stock checkpoint, and CTranslate2
# translating a text file (docs/export.md).
#
#   bash run.sh CHECKPOINT DATA_BIN WORKDIR [INPUT [SPM_MODEL]]
#
# CHECKPOINT: a checkpoint of a model that reduces to a standard Transformer (pre-/post-norm presets,
# DeepNorm, Admin, DS-Init, ...); DATA_BIN: its binarized data (dict.*.txt and the test split);
# INPUT: a file to translate, one sentence per line: raw text with SPM_MODEL (the data's
# sentencepiece model, e.g. fairseq-deep-prepare's DESTDIR/spm.model), else pieces as in the data.
# Variables (defaults): QUANT (int8: the second CTranslate2 export), BEAM (5), THREADS (2),
# DEVICE_ARGS ("--cpu" on a machine without GPU).
set -euo pipefail
if [ $# -lt 3 ]; then
    sed -n '2,14p' "$0"
    exit 2
fi
CK=$1 DATA=$2 WORK=$3 INPUT=${4:-} SPM=${5:-}
QUANT=${QUANT:-int8} BEAM=${BEAM:-5} THREADS=${THREADS:-2}
DEVICE_ARGS=${DEVICE_ARGS:-$(python -c 'import torch; print("" if torch.cuda.is_available() else "--cpu")')}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$WORK"
rm -rf "$WORK/fairseq" "$WORK/ct2" "$WORK/ct2_$QUANT"

# 1. the exports (each compares the stock model with the original before it writes anything)
fairseq-deep-export --checkpoint "$CK" --data "$DATA" --out "$WORK/fairseq" --format fairseq
fairseq-deep-export --checkpoint "$CK" --data "$DATA" --out "$WORK/ct2"
fairseq-deep-export --checkpoint "$CK" --data "$DATA" --out "$WORK/ct2_$QUANT" --quantization "$QUANT"

# 2. plain fairseq-generate, no --user-dir, on the stock checkpoint: the original model's hypotheses
POST=${SPM:+--post-process sentencepiece}
# shellcheck disable=SC2086
OMP_NUM_THREADS=$THREADS fairseq-generate "$DATA" --path "$WORK/fairseq/model.pt" --gen-subset test \
    --beam "$BEAM" --batch-size 32 $POST $DEVICE_ARGS > "$WORK/generate.txt"
tail -1 "$WORK/generate.txt"

# 3. CTranslate2, float32 and $QUANT, with the settings that give fairseq-generate's hypotheses
if [ -n "$INPUT" ]; then
    DEVICE=$([ "$DEVICE_ARGS" = "--cpu" ] && echo cpu || echo cuda)
    for model in ct2 "ct2_$QUANT"; do
        python "$HERE/translate.py" "$WORK/$model" ${SPM:+--spm "$SPM"} --beam "$BEAM" --threads "$THREADS" \
            --device "$DEVICE" < "$INPUT" > "$WORK/$model.txt"
        echo "$model: $(wc -l < "$WORK/$model.txt") translations in $WORK/$model.txt"
    done
fi
