#!/usr/bin/env bash
# Evaluate as in Wang et al. (2019), Sec. 4.1: average the last 5 epoch checkpoints, beam 4, length
# penalty 0.6, case-sensitive tokenized BLEU (multi-bleu.perl; compound words split as
# "##AT##-##AT##" like Vaswani et al. and fairseq's scaling_nmt recipe) on newstest2014.
#
#   bash generate.sh DATA_BIN SAVE_DIR [REF=wmt16_en_de/newstest2014.tok.bpe.32000.de]
#
# REF is the BPE'd tokenized reference written by prepare-data.sh (its BPE is removed here). Without
# it the references are taken from fairseq-generate's T- lines, where rare words are <unk>.
# Environment: SUBSET (test), N_AVG (5), BEAM (4), LENPEN (0.6), BATCH_SIZE (128).
set -euo pipefail

if [ $# -lt 2 ]; then
    sed -n '2,10p' "$0"
    exit 2
fi
DATA_BIN=$1
SAVE_DIR=$2
REF=${3:-}
SUBSET=${SUBSET:-test}
N_AVG=${N_AVG:-5}
BEAM=${BEAM:-4}
LENPEN=${LENPEN:-0.6}
BATCH_SIZE=${BATCH_SIZE:-128}
DEVICE_ARGS=()
if [ "$(python -c 'import torch; print(torch.cuda.device_count())')" -eq 0 ]; then
    DEVICE_ARGS=(--cpu)
fi

AVG="$SAVE_DIR/checkpoint.avg${N_AVG}.pt"
fairseq-deep-average-checkpoints --inputs "$SAVE_DIR" --num-epoch-checkpoints "$N_AVG" --output "$AVG"

OUT="$SAVE_DIR/generate-${SUBSET}.avg${N_AVG}.out"
fairseq-deep-generate "$DATA_BIN" "${DEVICE_ARGS[@]}" --path "$AVG" --gen-subset "$SUBSET" \
    --beam "$BEAM" --lenpen "$LENPEN" --batch-size "$BATCH_SIZE" --remove-bpe > "$OUT"

# Every input sentence must have exactly one hypothesis.
N_IN=$(python - "$DATA_BIN" "$SUBSET" <<'PY'
import glob, sys
from fairseq.data import data_utils
data, subset = sys.argv[1:]
idx = sorted(glob.glob(f"{data}/{subset}.*-*.*.idx"))
if not idx:
    sys.exit(f"no binarized {subset} split in {data}")
print(len(data_utils.load_indexed_dataset(idx[0][:-len(".idx")], None)))
PY
)
N_HYP=$(grep -c '^H-' "$OUT" || true)
if [ "$N_HYP" -ne "$N_IN" ]; then
    echo "error: $N_HYP hypotheses for $N_IN input sentences in $OUT" >&2
    exit 1
fi
if [ -n "$REF" ] && [ "$(wc -l < "$REF")" -ne "$N_IN" ]; then
    echo "error: $REF has $(wc -l < "$REF") lines, the $SUBSET split has $N_IN sentences" >&2
    exit 1
fi

# Hypotheses in input order, compound words split; references likewise.
compound_split() { perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'; }
grep '^H-' "$OUT" | sed 's/^H-//' | sort -n -k1,1 | cut -f3 | compound_split > "$OUT.sys"
if [ -n "$REF" ]; then
    sed -r 's/(@@ )|(@@ ?$)//g' "$REF" | compound_split > "$OUT.ref"
else
    grep '^T-' "$OUT" | sed 's/^T-//' | sort -n -k1,1 | cut -f2 | compound_split > "$OUT.ref"
fi
echo "$N_HYP hypotheses for $N_IN sentences; checkpoint $AVG"
fairseq-score --sys "$OUT.sys" --ref "$OUT.ref" | tee "$OUT.bleu"
