#!/usr/bin/env bash
# Figures of Bapna et al. (2018) from training runs of train.sh:
# r_t against the update for every run given (Fig. 1-3), s_(i,6) over training (Fig. 4), the loss,
# and the final s matrix of the last run's checkpoint as a heatmap.
#
#   bash plot.sh OUT_DIR SAVE_DIR [SAVE_DIR ...]
#
# Each SAVE_DIR holds train.log and checkpoint_last.pt as written by train.sh.
set -euo pipefail

if [ $# -lt 2 ]; then
    sed -n '2,8p' "$0"
    exit 2
fi
OUT=$1
shift
LOGS=()
LABELS=()
for d in "$@"; do
    LOGS+=("$d/train.log")
    LABELS+=("$(basename "$d")")
done
python -m fairseq_deep.diagnostics.plot_training "${LOGS[@]}" --labels "${LABELS[@]}" --out-dir "$OUT"
LAST="${!#}"
# softmax weights of 21 entries are ~0.05 each: show them all (the exporter's default mask is for DLCL)
python -m fairseq_deep.diagnostics.layer_weights "$LAST/checkpoint_last.pt" --out-dir "$OUT/final_weights" --no-mask
