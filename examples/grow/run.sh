#!/usr/bin/env bash
# Shallow-to-deep training (Li et al., EMNLP 2020) in one command: train a shallow model, grow it
# with fairseq-deep-grow, continue training with a learning-rate restart, grow again, ...
#
#   DEPTHS="6 12 18" bash run.sh DATA_BIN WORKDIR [extra fairseq-train options for every stage]
#
# Variables (defaults): ARCH (transformer_dlcl: pre-norm DLCL as Li et al.; a depth-free --arch),
# DEPTHS ("6 12 18": encoder layers of the stages), DEC (6 decoder layers), METHOD (stack: the top
# layers copied on top; interleave, identity), STAGE_UPDATES (4000 updates per stage), LR (0.002),
# WARMUP (4000: the first stage's warm-up), WARMUP_RESTART (WARMUP / 4: the warm-up of every later
# stage, the learning-rate restart; fairseq-deep-grow's printed next command takes the same),
# FREEZE_UPDATES (0; N > 0: Wu et al. 2019's frozen bottom, the first N updates of a grown stage
# train the new layers only, --freeze-grown-from), MAX_TOKENS (4096), MODEL_ARGS (model options of
# every stage, e.g. "--encoder-embed-dim 256 ..."), DEVICE_ARGS ("--cpu" on a machine without GPU),
# GEN_ARGS (fairseq-generate options of the last stage).
set -euo pipefail
if [ $# -lt 2 ]; then
    sed -n '2,15p' "$0"
    exit 2
fi
DATA=$1 WORK=$2
shift 2
ARCH=${ARCH:-transformer_dlcl} DEPTHS=${DEPTHS:-6 12 18} DEC=${DEC:-6} METHOD=${METHOD:-stack}
STAGE_UPDATES=${STAGE_UPDATES:-4000} LR=${LR:-0.002} WARMUP=${WARMUP:-4000}
WARMUP_RESTART=${WARMUP_RESTART:-$(( WARMUP / 4 > 0 ? WARMUP / 4 : 1 ))}  # runs.recipes.RESTART_WARMUP
FREEZE_UPDATES=${FREEZE_UPDATES:-0} MAX_TOKENS=${MAX_TOKENS:-4096} MODEL_ARGS=${MODEL_ARGS:-}
DEVICE_ARGS=${DEVICE_ARGS:-$(python -c 'import torch; print("" if torch.cuda.is_available() else "--cpu")')}
GEN_ARGS=${GEN_ARGS:---beam 5 --batch-size 64}
mkdir -p "$WORK"

train() {  # train DEPTH SAVE_DIR WARMUP MAX_UPDATE [options]
    local depth=$1 save=$2 warmup=$3 updates=$4
    shift 4
    # shellcheck disable=SC2086
    fairseq-deep-train "$DATA" --arch "$ARCH" --encoder-layers "$depth" --decoder-layers "$DEC" $MODEL_ARGS \
        --task translation_deep --optimizer adam --adam-betas '(0.9, 0.997)' --lr "$LR" \
        --lr-scheduler inverse_sqrt --warmup-init-lr 1e-7 --warmup-updates "$warmup" \
        --criterion label_smoothed_cross_entropy --label-smoothing 0.1 --max-tokens "$MAX_TOKENS" \
        --max-update "$updates" --save-dir "$save" --no-epoch-checkpoints $DEVICE_ARGS "$@" \
        "${EXTRA[@]}" 2>&1 | tee "$save.log"
}

EXTRA=("$@")
previous=""
for depth in $DEPTHS; do
    save="$WORK/enc$depth"
    mkdir -p "$save"
    if [ -z "$previous" ]; then
        train "$depth" "$save" "$WARMUP" "$STAGE_UPDATES"
    else
        grown="$WORK/grown_enc$depth.pt"
        fairseq-deep-grow --checkpoint "$WORK/enc$previous/checkpoint_last.pt" --out "$grown" \
            --encoder-layers "$depth" --method "$METHOD"
        restore=(--restore-file "$grown" --reset-optimizer --reset-lr-scheduler --reset-dataloader)
        if [ "$FREEZE_UPDATES" -gt 0 ]; then  # Wu et al.: the new layers first, on a fixed bottom
            mkdir -p "$save.frozen"
            train "$depth" "$save.frozen" "$WARMUP_RESTART" "$FREEZE_UPDATES" "${restore[@]}" \
                --freeze-grown-from "$previous"
            restore=(--restore-file "$save.frozen/checkpoint_last.pt" --reset-optimizer --reset-lr-scheduler
                     --reset-dataloader)
        fi
        # the learning-rate restart: the optimizer and schedule start again (a short warm-up, then
        # inverse square root decay from the peak LR)
        train "$depth" "$save" "$WARMUP_RESTART" "$STAGE_UPDATES" "${restore[@]}"
    fi
    previous=$depth
done
# shellcheck disable=SC2086
fairseq-deep-generate "$DATA" --path "$WORK/enc$previous/checkpoint_last.pt" --gen-subset test $GEN_ARGS \
    $DEVICE_ARGS | tee "$WORK/generate.txt" | tail -1
