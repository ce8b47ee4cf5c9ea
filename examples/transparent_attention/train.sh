#!/usr/bin/env bash
# Train a row of Tables 1-2 of Bapna et al. (2018): Transformer Base with a deep encoder, 6-layer
# decoder, with transparent attention (default) or without (the baselines); only --arch changes.
#
#   bash train.sh DATA_BIN [SAVE_DIR=checkpoints/ARCH] [extra fairseq-train options]
#
# ARCH: transformer_ta{,_12l,_16l,_20l} (Transparent), transformer_ta_baseline{,_12l,_16l,_20l}
# (Baseline), transformer_ta_nores{,_12l,_16l,_20l} (Baseline - residuals).
# Learning rate: Chen et al. (2018) Eq. 2 with r0 = 3.0 and 40k warm-up steps (Bapna et al. Sec. 2.2),
# --lr-scheduler noam (--lr is not used by it). Adam, label smoothing 0.1, all dropouts 0.1.
# Batch: 65,536 target tokens per update as the Transformer runs of Chen et al. (2018); on G GPUs
# MAX_TOKENS x UPDATE_FREQ x G = 65,536 (UPDATE_FREQ = 16 / G with MAX_TOKENS = 4096).
# Diagnostics: r_t (Sec. 2.3) and s_(i,6) (Fig. 4) in the train log and under SAVE_DIR/tb.
# Environment overrides: ARCH (transformer_ta_16l), MAX_TOKENS (4096), UPDATE_FREQ, NUM_GPUS,
# MAX_UPDATE (300000), R0 (3.0), WARMUP (40000), D_MODEL (512), SEED (1).
set -euo pipefail

if [ $# -lt 1 ]; then
    sed -n '2,9p' "$0"
    exit 2
fi
DATA_BIN=$1
ARCH=${ARCH:-transformer_ta_16l}
SAVE_DIR=${2:-checkpoints/$ARCH}
shift $(( $# >= 2 ? 2 : 1 ))

MAX_TOKENS=${MAX_TOKENS:-4096}
MAX_UPDATE=${MAX_UPDATE:-300000}
R0=${R0:-3.0}
WARMUP=${WARMUP:-40000}
D_MODEL=${D_MODEL:-512}
SEED=${SEED:-1}
NUM_GPUS=${NUM_GPUS:-$(python -c 'import torch; print(torch.cuda.device_count())')}
DEVICE_ARGS=()
if [ "$NUM_GPUS" -eq 0 ]; then
    echo "warning: no GPU found; training on the CPU (only sensible for a smoke test)" >&2
    DEVICE_ARGS=(--cpu)
    NUM_GPUS=1
fi
UPDATE_FREQ=${UPDATE_FREQ:-$(( 16 / NUM_GPUS > 0 ? 16 / NUM_GPUS : 1 ))}
echo "tokens per update: ${MAX_TOKENS} x ${UPDATE_FREQ} x ${NUM_GPUS} = $(( MAX_TOKENS * UPDATE_FREQ * NUM_GPUS ))"

TA_ARGS=()
case "$ARCH" in
    transformer_ta_baseline*|transformer_ta_nores*) ;;
    transformer_ta*) TA_ARGS=(--log-ta-weights last) ;;
esac

mkdir -p "$SAVE_DIR"
# fairseq-deep-train is fairseq-train with --user-dir set to the installed fairseq_deep.
fairseq-deep-train "$DATA_BIN" "${DEVICE_ARGS[@]}" \
    --arch "$ARCH" --share-all-embeddings \
    --task translation_deep --log-grad-norm-ratio "${TA_ARGS[@]}" \
    --optimizer adam --adam-betas '(0.9, 0.98)' --adam-eps 1e-9 --clip-norm 0.0 \
    --lr-scheduler noam --noam-r0 "$R0" --warmup-updates "$WARMUP" --noam-d-model "$D_MODEL" \
    --criterion label_smoothed_cross_entropy --label-smoothing 0.1 \
    --max-tokens "$MAX_TOKENS" --update-freq "$UPDATE_FREQ" --max-update "$MAX_UPDATE" \
    --seed "$SEED" --save-dir "$SAVE_DIR" --tensorboard-logdir "$SAVE_DIR/tb" \
    --log-format simple --log-interval 100 --log-file "$SAVE_DIR/train.log" \
    "$@"
