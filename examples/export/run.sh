#!/usr/bin/env bash
# From a trained model to a served one: fairseq-deep-export to fairseq's own transformer and to
# CTranslate2 (its compute types timed on this machine), plain fairseq-generate on the stock
# checkpoint, CTranslate2 translating a text file, and both scored by fairseq-deep-score
# (docs/export.md).
#
#   bash run.sh CHECKPOINT DATA_BIN WORKDIR [INPUT [SPM_MODEL [REFERENCE]]]
#
# CHECKPOINT: a checkpoint of a model that reduces to a standard Transformer (pre-/post-norm presets,
# DeepNorm, Admin, DS-Init, ...; an averaged one too); DATA_BIN: its binarized data (dict.*.txt and
# the test split); INPUT: a file to translate, one sentence per line: raw text with SPM_MODEL (the
# data's sentencepiece model, e.g. fairseq-deep-prepare's DESTDIR/spm.model), else pieces as in the
# data; REFERENCE: the raw references of the test split (then INPUT is its raw source): both
# engines' translations are scored with sacreBLEU.  INPUT and REFERENCE: plain or .gz, as the
# own-data recipe takes them (Multi30k's test_2016_flickr.de.gz).  Variables (defaults):
# COMPUTE_TYPE (the one the export found fastest here), BEAM (5), MAX_LEN_A and MAX_LEN_B (1.2 and
# 10, the recipes' length limit), BATCH (32), THREADS (2), DEVICE_ARGS ("--cpu" without a GPU).
set -euo pipefail
if [ $# -lt 3 ]; then
    sed -n '2,18p' "$0"
    exit 2
fi
CK=$1 DATA=$2 WORK=$3 INPUT=${4:-} SPM=${5:-} REF=${6:-}
BEAM=${BEAM:-5} MAX_LEN_A=${MAX_LEN_A:-1.2} MAX_LEN_B=${MAX_LEN_B:-10} BATCH=${BATCH:-32} THREADS=${THREADS:-2}
DEVICE_ARGS=${DEVICE_ARGS:-$(python -c 'import torch; print("" if torch.cuda.is_available() else "--cpu")')}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$WORK"
rm -rf "$WORK/fairseq" "$WORK/ct2"

# 1. the exports (each compares the stock model with the original before it writes anything); the
#    CTranslate2 one times every compute type CTranslate2 offers here on 32 test sentences
fairseq-deep-export --checkpoint "$CK" --data "$DATA" --out "$WORK/fairseq" --format fairseq
OMP_NUM_THREADS=$THREADS fairseq-deep-export --checkpoint "$CK" --data "$DATA" --out "$WORK/ct2" \
    --timing-threads "$THREADS"
COMPUTE_TYPE=${COMPUTE_TYPE:-$(python -c 'import json, sys
record = json.load(open(sys.argv[1])).get("compute_types") or {}
print(record.get("fastest", "default"))' "$WORK/ct2/fairseq_deep_export.json")}

# 2. plain fairseq-generate, no --user-dir, on the stock checkpoint: the original model's hypotheses
#    (--required-batch-size-multiple 1: plain fairseq drops a last partial batch otherwise, #5036)
POST=${SPM:+--post-process sentencepiece}
# shellcheck disable=SC2086
OMP_NUM_THREADS=$THREADS fairseq-generate "$DATA" --path "$WORK/fairseq/model.pt" --gen-subset test \
    --beam "$BEAM" --max-len-a "$MAX_LEN_A" --max-len-b "$MAX_LEN_B" --batch-size "$BATCH" \
    --required-batch-size-multiple 1 $POST $DEVICE_ARGS > "$WORK/generate.txt"
tail -1 "$WORK/generate.txt"
if [ -n "$REF" ]; then
    fairseq-deep-score "$WORK/generate.txt" --ref "$REF" | tee "$WORK/generate.score"
fi

# 3. CTranslate2 in $COMPUTE_TYPE, with the settings that give fairseq-generate's hypotheses
if [ -n "$INPUT" ]; then
    DEVICE=$([ "$DEVICE_ARGS" = "--cpu" ] && echo cpu || echo cuda)
    # the input as it is stored, plain or gzip (fairseq-deep-score reads a .gz REFERENCE itself)
    case "$INPUT" in *.gz) gzip -dc -- "$INPUT" ;; *) cat -- "$INPUT" ;; esac |
        python "$HERE/translate.py" "$WORK/ct2" ${SPM:+--spm "$SPM"} --beam "$BEAM" \
        --max-len-a "$MAX_LEN_A" --max-len-b "$MAX_LEN_B" --batch "$BATCH" --threads "$THREADS" \
        --device "$DEVICE" --compute-type "$COMPUTE_TYPE" > "$WORK/ct2.txt"
    echo "ct2 ($COMPUTE_TYPE): $(wc -l < "$WORK/ct2.txt") translations in $WORK/ct2.txt"
    if [ -n "$REF" ]; then
        fairseq-deep-score "$WORK/ct2.txt" --ref "$REF" | tee "$WORK/ct2.score"
    fi
fi
