#!/usr/bin/env bash
# Your own parallel text to a trained deep model, translations and sacreBLEU, in one script, in a
# time budget.
#
#   SRC=de TGT=en RAW=path/to/raw [MINUTES=30] bash examples/own_data/run.sh [ARCH] [fairseq-train flags]
#
# RAW holds train.SRC, train.TGT, valid.*, test.* (plain or .gz), one raw sentence per line;
# without valid.*, Multi30k's val.* are taken (and said).
# ARCH: any architecture of the package (default transformer_dlcl; fairseq-deep-list-archs lists
# them, `fairseq-deep-train --arch X --help` shows their options); the flags go to fairseq-train
# last, so they override the script's.  Settings by environment (defaults CPU / CUDA):
#   MINUTES     the whole run, preparation and decoding included (30 / 480); training gets what is
#               left after preparation and decoding's time at the speed measured here before any
#               work (at most a fifth of MINUTES; fairseq's --stop-time-hours); decoding measures
#               its speed again on its first batches and decodes the whole test set when the time
#               left allows, else a subset of every length sized by that speed, and says so; it
#               starts no batch after the run's start + MINUTES - MARGIN_S (15 s kept for scoring;
#               FAIRSEQ_DEEP_DEADLINE), and the score says when it is of part of the test set;
#               training says after its first updates when MINUTES cannot reach the end of warm-up,
#               and which MINUTES would
#   WIDTH       model width (128 / 512; Transformers: FFN 4 x WIDTH; 0: the architecture's own)
#   MAX_UPDATE  a cap on the updates (none / 50000); MINUTES=0 MAX_UPDATE=N trains N updates
#   WORK (own_data_run), VOCAB (8000), MAX_TOKENS (2048 / 4096), LR (2e-3 / 1e-3), WARMUP (400 / 4000),
#   BEAM (5), AVERAGE (5: average up to the last 5 epoch checkpoints of the second half of
#   training; 0: decode checkpoint_best.pt), LOG_INTERVAL (10 / 100), PRECISION (e.g. --fp16 or
#   --bf16 on a GPU), DEVICE=--cpu (use the CPU although CUDA is there).
# Everything is checked before any work; preparation is done once (WORK/prepare.stamp); running
# again resumes WORK/checkpoints/ARCH_wWIDTH/checkpoint_last.pt (delete it to start afresh) and
# keeps the earlier run's train.log, generate.out, score.txt and test.hyp as NAME.1 (then .2, ...).
set -euo pipefail
START=$(date +%s)
export PYTHONUNBUFFERED=1  # progress lines as they come, also through tee

setup=$(RUN_START=$START python -m fairseq_deep.own_data setup "$@") || exit $?
eval "$setup"  # WORK SAVE DATA_BIN PREFIX_* VOCAB BUDGET_S RESERVE_S MARGIN_S AVERAGE REF TRAIN() GENERATE() INTERACTIVE()
               # RESERVE_FIXED_S DECODE_ALL_S DECODE_SHARE EARLIER SERVE SERVE_EXPORT() [SERVE_DISTILL() SERVE_STUDENT()]
mkdir -p "$WORK"
# an earlier run's train.log, generate.out, score.txt and test.hyp are kept as NAME.N (setup says so)
for ((i = 0; i < ${#EARLIER[@]}; i += 2)); do mv -- "${EARLIER[i]}" "${EARLIER[i + 1]}"; done

# 1. sentencepiece (joint) + fairseq-preprocess, unless WORK/prepare.stamp says it is done
echo "== 1/4 preparing $WORK (sentencepiece, fairseq-preprocess)"
fairseq-deep-prepare --quiet --source-lang "$SRC" --target-lang "$TGT" --trainpref "$PREFIX_TRAIN" \
  --validpref "$PREFIX_VALID" --testpref "$PREFIX_TEST" --destdir "$WORK" --vocab-size "$VOCAB"

# 2. train for what is left of the budget
BUDGET_FLAGS=()
if [ "$BUDGET_S" -gt 0 ]; then
  elapsed=$(( $(date +%s) - START ))
  train_s=$(( BUDGET_S - elapsed - RESERVE_S ))
  if [ "$train_s" -lt 60 ]; then
    echo "run.sh: warning: MINUTES leaves $train_s s for training after preparation (${elapsed} s) and" \
         "the decoding reserve (${RESERVE_S} s); training 60 s anyway, decoding stops at the budget's end" >&2
    train_s=60
  fi
  BUDGET_FLAGS=(--stop-time-hours "$(awk -v s="$train_s" 'BEGIN { printf "%.5f", s / 3600 }')")
  # a budget too small to learn: training says which MINUTES would do
  export FAIRSEQ_DEEP_RECIPE_BUDGET="MINUTES $(( elapsed + RESERVE_FIXED_S )) $DECODE_ALL_S $DECODE_SHARE"
  echo "== 2/4 training for $train_s s (at $(date -d "@$(( $(date +%s) + train_s ))" +%H:%M:%S 2>/dev/null || echo "+$train_s s")" \
       "it stops after the update it is in, validates and saves), log: $WORK/train.log"
else
  echo "== 2/4 training (MAX_UPDATE, no time budget), log: $WORK/train.log"
fi
echo "   fairseq-deep-train$(printf ' %q' "${TRAIN[@]}" ${BUDGET_FLAGS[@]+"${BUDGET_FLAGS[@]}"})"
# the console gets the progress lines, validation, warnings and errors; the log everything (fairseq's
# whole configuration and the model's printout included)
SHOWN='\| fairseq_deep\.|\| (WARNING|ERROR) \||\| (valid|train) \||done training|Stopping training|Loaded checkpoint|: error: |^Traceback|^[A-Za-z_.]*(Error|Exception)\b'
set +e
fairseq-deep-train "${TRAIN[@]}" ${BUDGET_FLAGS[@]+"${BUDGET_FLAGS[@]}"} 2>&1 | tee "$WORK/train.log" |
  { grep --line-buffered -E "$SHOWN" || true; }
status=${PIPESTATUS[0]}
set -e
if [ "$status" -ne 0 ]; then
  [ "$status" -eq 2 ] || { echo "run.sh: training failed (exit status $status); the end of $WORK/train.log:"; tail -n 15 "$WORK/train.log"; } >&2
  exit "$status"
fi

# 3. average the last epoch checkpoints (or take the best), translate the test set in input order;
# with a budget: all of it when the speed measured on the first batches says it ends before the
# budget's end less MARGIN_S, else a subset of every length sized by that speed, and no batch is
# started after it (what decoding did not reach is left out of the score, which says so)
DEADLINE=""
if [ "$BUDGET_S" -gt 0 ]; then
  DEADLINE=$(( START + BUDGET_S - MARGIN_S ))
  echo "== 3/4 translating the test set (no batch started after $(date -d "@$DEADLINE" +%H:%M:%S 2>/dev/null || echo "$DEADLINE"))"
else
  echo "== 3/4 translating the test set"
fi
CKPT=$(python -m fairseq_deep.own_data checkpoint "$SAVE" "$AVERAGE")
FAIRSEQ_DEEP_DEADLINE=$DEADLINE \
  fairseq-deep-generate "${GENERATE[@]}" --path "$CKPT" | tee "$WORK/generate.out" |
  { grep --line-buffered -E "\| progress:|decoding stopped at the deadline|decoding a subset|decoding the whole test set" || true; }

# 4. one sacreBLEU score (detokenized hypotheses against the raw references)
echo "== 4/4 scoring"
python -m fairseq_deep.own_data score "$REF" "$WORK/generate.out" "$WORK/test.hyp" | tee "$WORK/score.txt"
echo "run.sh: done in $(( $(date +%s) - START )) s (budget: $BUDGET_S s); translations: $WORK/test.hyp"
echo "Translate your own sentences (sentencepiece applied and removed for you):"
echo "  fairseq-deep-interactive ${INTERACTIVE[*]} --path $CKPT"
# serving with CTranslate2 (setup said at the start whether the model exports)
case "$SERVE" in
  export)
    echo "Serve it with CTranslate2 (docs/export.md):"
    echo " $(printf ' %q' "${SERVE_EXPORT[@]}" --checkpoint "$CKPT")" ;;
  distill)
    echo "CTranslate2 cannot serve this model; distil it into a student that it serves, trained as long" \
         "as this model was (docs/distill.md):"
    echo " $(printf ' %q' "${SERVE_DISTILL[@]}" --path "$CKPT")"
    echo " $(printf ' %q' "${SERVE_STUDENT[@]}" ${BUDGET_FLAGS[@]+"${BUDGET_FLAGS[@]}"})"
    echo " $(printf ' %q' "${SERVE_EXPORT[@]}")" ;;
esac
