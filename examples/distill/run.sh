#!/usr/bin/env bash
# A deep teacher to a light student served by CTranslate2, in one command, in a time budget
# (docs/distill.md, "The recipe").
#
#   TEACHER=CK.pt DATA_BIN=DIR [REF=test.TGT SOURCE=test.SRC [SPM=spm.model]] [MINUTES=30] \
#       bash examples/distill/run.sh [STUDENT TRAIN FLAGS]
#   SRC=de TGT=en RAW=path/to/raw [TEACHER_MINUTES=30] [MINUTES=30] bash examples/distill/run.sh [...]
#
# TEACHER: any checkpoint the package loads (e.g. the own-data recipe's
# WORK/checkpoints/transformer_dlcl_w128/checkpoint_average.pt) with DATA_BIN, the data-bin it was
# trained on (WORK/data-bin); REF and SOURCE: the raw test references and source (plain or .gz),
# to score the student's translations with sacreBLEU; SPM: the data's sentencepiece model (found
# beside DATA_BIN when fairseq-deep-prepare wrote it). Without TEACHER, the own-data recipe
# (examples/own_data/run.sh) trains its DLCL model on SRC/TGT/RAW first, in WORK/teacher, for
# TEACHER_MINUTES.  Then: fairseq-deep-distill -> a student trained on the teacher's translations
# -> its test translations scored -> fairseq-deep-export to CTranslate2 -> CTranslate2's
# translations scored.  Settings by environment: MINUTES (30 on a CPU: 40% for distillation, the
# rest for the student less 20% kept for decoding, export and scoring; said at the start),
# STUDENT_ARCH (transformer_prenorm; one that exports), WIDTH (the teacher's), WORK (distill_run),
# and the own-data recipe's LR, WARMUP, MAX_TOKENS, BEAM, AVERAGE, PRECISION, DEVICE.  The flags
# go to the student's fairseq-train last (e.g. --encoder-layers 12 --decoder-layers 1).
# Everything is checked before any work; running again resumes (the distillation where it
# stopped, the student from its checkpoint_last.pt, the export when done is kept).
set -euo pipefail
START=$(date +%s)
export PYTHONUNBUFFERED=1
HERE=$(cd "$(dirname "$0")" && pwd)

setup=$(python -m fairseq_deep.distill_recipe setup "$@") || exit $?
eval "$setup"  # WORK TEACHER TEACHER_MINUTES DATA_BIN SAVE DISTILLED CT2 BUDGET_S DISTILL_S RESERVE_S
               # MARGIN_S AVERAGE REF SOURCE DISTILL() STUDENT() GENERATE() EXPORT() TRANSLATE()
mkdir -p "$WORK"
show() { echo "   $(printf ' %q' "$@" | cut -c2-)"; }

# 0. the teacher: the own-data recipe's DLCL model when none is given
if [ -z "$TEACHER" ]; then
  echo "== 0/5 the teacher: examples/own_data/run.sh for $TEACHER_MINUTES minutes in $WORK/teacher"
  WORK="$WORK/teacher" MINUTES=$TEACHER_MINUTES bash "$HERE/../own_data/run.sh" transformer_dlcl
  TEACHER=$(python -m fairseq_deep.distill_recipe teacher "$WORK/teacher")
  START=$(date +%s)  # MINUTES is for what follows the teacher
fi

# 1. the teacher's translations of the training set, stopped at its share of the budget
echo "== 1/5 distilling the training set with $TEACHER into $DISTILLED"
show "${DISTILL[@]}" --path "$TEACHER"
set +e
if [ "$BUDGET_S" -gt 0 ]; then
  timeout --signal=INT "$DISTILL_S" "${DISTILL[@]}" --path "$TEACHER"
else
  "${DISTILL[@]}" --path "$TEACHER"
fi
status=$?
set -e
if [ "$status" -eq 124 ]; then
  echo "run.sh: distillation did not end in its $DISTILL_S s of MINUTES; run the same command" \
       "again: it resumes where it stopped (or give a larger MINUTES)" >&2
  exit 3
fi
[ "$status" -eq 0 ] || exit "$status"

# 2. the student, for what is left of the budget less the reserve
BUDGET_FLAGS=()
if [ "$BUDGET_S" -gt 0 ]; then
  train_s=$(( BUDGET_S - ($(date +%s) - START) - RESERVE_S ))
  if [ "$train_s" -lt 60 ]; then
    echo "run.sh: warning: $train_s s left for the student; training 60 s anyway" >&2
    train_s=60
  fi
  BUDGET_FLAGS=(--stop-time-hours "$(awk -v s="$train_s" 'BEGIN { printf "%.5f", s / 3600 }')")
  echo "== 2/5 training the student for $train_s s, log: $WORK/train.log"
else
  echo "== 2/5 training the student, log: $WORK/train.log"
fi
show "${STUDENT[@]}" ${BUDGET_FLAGS[@]+"${BUDGET_FLAGS[@]}"}
set +e
"${STUDENT[@]}" ${BUDGET_FLAGS[@]+"${BUDGET_FLAGS[@]}"} 2>&1 | tee "$WORK/train.log" |
  { grep --line-buffered -E '\| (valid|train) \||done training|: error: |^Traceback|Error\b' || true; }
status=${PIPESTATUS[0]}
set -e
[ "$status" -eq 0 ] || { echo "run.sh: training failed (exit status $status); see $WORK/train.log" >&2; exit "$status"; }

# 3. the student's test translations in fairseq-generate (no batch started after the budget's
#    end less MARGIN_S), scored
echo "== 3/5 the student's test translations (fairseq-generate)"
CKPT=$(python -m fairseq_deep.own_data checkpoint "$SAVE" "$AVERAGE")
DEADLINE=""
[ "$BUDGET_S" -le 0 ] || DEADLINE=$(( START + BUDGET_S - MARGIN_S ))
show "${GENERATE[@]}" --path "$CKPT"
FAIRSEQ_DEEP_DEADLINE=$DEADLINE "${GENERATE[@]}" --path "$CKPT" > "$WORK/generate.out"
# scored as the own-data recipe scores (a decoding cut by the deadline is scored on what it
# decoded, and said), the translations in input order in WORK/test.hyp
if [ -n "$REF" ]; then
  python -m fairseq_deep.own_data score "$REF" "$WORK/generate.out" "$WORK/test.hyp" | tee "$WORK/score.txt"
fi

# 4. the student exported to CTranslate2 (kept when an earlier run exported it)
echo "== 4/5 exporting the student to CTranslate2: $CT2"
if [ -f "$CT2/fairseq_deep_export.json" ]; then
  echo "   $CT2 is there (an earlier run's export): kept"
else
  show "${EXPORT[@]}" --checkpoint "$CKPT"
  "${EXPORT[@]}" --checkpoint "$CKPT"
fi

# 5. CTranslate2's translations of the test source, scored
if [ -n "$SOURCE" ]; then
  # served as the export found fastest here, with this recipe's decoding (translate.py --fastest:
  # the backend, compute type and threads of WORK/ctranslate2/serving.json)
  echo "== 5/5 the student's test translations in CTranslate2"
  show python "${TRANSLATE[@]}"
  case "$SOURCE" in *.gz) gzip -dc -- "$SOURCE" ;; *) cat -- "$SOURCE" ;; esac |
    python "${TRANSLATE[@]}" > "$WORK/ct2.txt"
  [ -z "$REF" ] || fairseq-deep-score "$WORK/ct2.txt" --ref "$REF" | tee "$WORK/ct2.score.txt"
else
  echo "== 5/5 no SOURCE: CTranslate2 translates nothing here (examples/export/translate.py $CT2)"
fi
echo "run.sh: done in $(( $(date +%s) - START )) s (budget: $BUDGET_S s); the student: $CKPT, served from $CT2"
