#!/usr/bin/env bash
# Translate newstest2014 as in Zhou et al. (2016), Sec. 3.3 and 4.4: beam 3, hypotheses ranked by
# their total log-likelihood (no length normalisation: --unnormalized), tokenized case-sensitive
# BLEU (multi-bleu.perl, here fairseq-score, which computes the same corpus BLEU) against the
# tokenized references.  Several checkpoints given as a:b:c are ensembled (Sec. 4.4.2).
#
#   bash generate.sh DATA_BIN CHECKPOINTS [extra fairseq-generate flags]
#
#   CHECKPOINTS: one .pt, or several joined by ':' (e.g. seed1/checkpoint_best.pt:seed2/...:seed3/...)
# Environment: SUBSET (test), BEAM (3), BATCH_SIZE (64), REF (DATA_BIN/SUBSET.ref.fr).
# Add --replace-unk to copy the source word with the highest attention weight in place of <unk>
# (a simple form of the unknown-word post-processing of Sec. 4.4.2, Deep-Att only).
set -euo pipefail

if [ $# -lt 2 ]; then
    sed -n '2,13p' "$0"
    exit 2
fi
DATA_BIN=$1
CKPTS=$2
shift 2
SUBSET=${SUBSET:-test}
BEAM=${BEAM:-3}
BATCH_SIZE=${BATCH_SIZE:-64}
REF=${REF:-$DATA_BIN/$SUBSET.ref.fr}
DEVICE_ARGS=()
if [ "$(python -c 'import torch; print(torch.cuda.device_count())')" -eq 0 ]; then
    DEVICE_ARGS=(--cpu)
fi

OUT=${OUT:-generate-$SUBSET.out}
fairseq-deep-generate "$DATA_BIN" "${DEVICE_ARGS[@]}" --task translation \
    --source-lang en --target-lang fr --path "$CKPTS" --gen-subset "$SUBSET" \
    --beam "$BEAM" --unnormalized --batch-size "$BATCH_SIZE" "$@" > "$OUT"

# Hypotheses in input order (fairseq prints them sorted by length).
grep '^H-' "$OUT" | sed 's/^H-//' | sort -n -k1,1 | cut -f3 > "$OUT.sys"
N_HYP=$(wc -l < "$OUT.sys")
if [ -f "$REF" ]; then
    [ "$(wc -l < "$REF")" -eq "$N_HYP" ] || { echo "error: $N_HYP hypotheses, $(wc -l < "$REF") references" >&2; exit 1; }
    cp "$REF" "$OUT.ref"
else
    grep '^T-' "$OUT" | sed 's/^T-//' | sort -n -k1,1 | cut -f2 > "$OUT.ref"
fi
echo "$N_HYP hypotheses; checkpoints $CKPTS"
fairseq-score --sys "$OUT.sys" --ref "$OUT.ref" | tee "$OUT.bleu"
