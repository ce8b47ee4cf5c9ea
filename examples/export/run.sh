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
# COMPUTE_TYPE (default: the export's fastest way here, WORK/ct2/serving.json), BEAM (5), MAX_LEN_A
# and MAX_LEN_B (1.2 and 10, the recipes' length limit), BATCH (32), THREADS (2), DEVICE_ARGS
# ("--cpu" without a GPU).
set -euo pipefail
if [ $# -lt 3 ]; then
    sed -n '2,19p' "$0"
    exit 2
fi
CK=$1 DATA=$2 WORK=$3 INPUT=${4:-} SPM=${5:-} REF=${6:-}
BEAM=${BEAM:-5} MAX_LEN_A=${MAX_LEN_A:-1.2} MAX_LEN_B=${MAX_LEN_B:-10} BATCH=${BATCH:-32} THREADS=${THREADS:-2}
DEVICE_ARGS=${DEVICE_ARGS:-$(python -c 'import torch; print("" if torch.cuda.is_available() else "--cpu")')}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$WORK"
rm -rf "$WORK/fairseq" "$WORK/ct2"

# 1. the exports (each compares the stock model with the original before it writes anything); the
#    CTranslate2 one times the ways to serve it here (backend CT2_USE_MKL, compute type, threads) on
#    128 test sentences with this script's decoding settings, and writes the fastest to serving.json
fairseq-deep-export --checkpoint "$CK" --data "$DATA" --out "$WORK/fairseq" --format fairseq
OMP_NUM_THREADS=$THREADS fairseq-deep-export --checkpoint "$CK" --data "$DATA" --out "$WORK/ct2" \
    --timing-threads "$THREADS" --timing-beam "$BEAM" --timing-max-len-a "$MAX_LEN_A" \
    --timing-max-len-b "$MAX_LEN_B" --timing-batch-size "$BATCH"
# COMPUTE_TYPE given: that type on $THREADS threads in CTranslate2's default backend; else the
# export's choice (translate.py --fastest: its CT2_USE_MKL, compute type, threads)
if [ -n "${COMPUTE_TYPE:-}" ]; then
    SERVE=(--compute-type "$COMPUTE_TYPE" --threads "$THREADS")
    SERVED=$COMPUTE_TYPE
else
    SERVE=(--fastest)
    SERVED="the export's choice: $(python -c 'import json, os, sys
path = os.path.join(sys.argv[1], "serving.json")
c = json.load(open(path)) if os.path.exists(path) else {}
print(" ".join(f"{k}={v}" for k, v in c.get("env", {}).items()), c.get("compute_type", "default"),
      "intra_threads", c.get("intra_threads", "-"), "inter_threads", c.get("inter_threads", "-"))' "$WORK/ct2")"
fi

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

# 3. CTranslate2 as chosen above, with the settings that give fairseq-generate's hypotheses
if [ -n "$INPUT" ]; then
    DEVICE=$([ "$DEVICE_ARGS" = "--cpu" ] && echo cpu || echo cuda)
    # the input as it is stored, plain or gzip (fairseq-deep-score reads a .gz REFERENCE itself)
    case "$INPUT" in *.gz) gzip -dc -- "$INPUT" ;; *) cat -- "$INPUT" ;; esac |
        python "$HERE/translate.py" "$WORK/ct2" ${SPM:+--spm "$SPM"} --beam "$BEAM" \
        --max-len-a "$MAX_LEN_A" --max-len-b "$MAX_LEN_B" --batch "$BATCH" --device "$DEVICE" \
        "${SERVE[@]}" > "$WORK/ct2.txt"
    echo "ct2 ($SERVED): $(wc -l < "$WORK/ct2.txt") translations in $WORK/ct2.txt"
    if [ -n "$REF" ]; then
        fairseq-deep-score "$WORK/ct2.txt" --ref "$REF" | tee "$WORK/ct2.score"
    fi
fi
