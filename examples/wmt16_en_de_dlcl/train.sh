#!/usr/bin/env bash
# Train the paper's deep system: pre-norm DLCL, 30-layer encoder, 6-layer decoder, Transformer-Base
# width (Wang et al. 2019, Sec. 4.2 and Appendix B, Table 7: deep models use batch 8192, lr 2e-3,
# warmup 16k, 50k updates; Adam beta2 = 0.997 for pre-norm models, 0.98 for post-norm ones, as
# for the baselines of Sec. 4.2).
#
#   bash train.sh DATA_BIN [SAVE_DIR=checkpoints/wmt16_en_de_dlcl30] [extra fairseq-train options]
#
# Batch arithmetic. The paper's batch is counted per GPU on 8 GPUs: 4096 tokens per GPU for the
# baselines, 2 x 4096 = 8192 for deep models, obtained by accumulating two batches of 4096
# (--max-tokens 4096 --update-freq 2, as in the authors' scripts). One update therefore sees
# 8 GPUs x 4096 tokens x 2 = 65,536 tokens. On G GPUs this script keeps that total:
# UPDATE_FREQ = 16 / G (8 GPUs: 2, 4 GPUs: 4, 1 GPU: 16). With less GPU memory, lower MAX_TOKENS
# and raise UPDATE_FREQ so that MAX_TOKENS x UPDATE_FREQ x G stays 65,536.
# 50k updates of 65k tokens are about 20 epochs of the 4.5M-pair corpus; a checkpoint is saved at
# the end of every epoch (generate.sh averages the last 5).
#
# Environment overrides: ARCH (transformer_dlcl_30l), MAX_TOKENS (4096), UPDATE_FREQ, NUM_GPUS
# (detected), MAX_UPDATE (50000), LR (2e-3), WARMUP (16000), SEED (1), BETA2 (0.98 when ARCH names
# a post-norm model, else 0.997), PRECISION (e.g. --fp16 or --bf16; see docs/precision.md).
set -euo pipefail

if [ $# -lt 1 ]; then
    sed -n '2,9p' "$0"
    exit 2
fi
DATA_BIN=$1
SAVE_DIR=${2:-checkpoints/wmt16_en_de_dlcl30}
shift $(( $# >= 2 ? 2 : 1 ))

ARCH=${ARCH:-transformer_dlcl_30l}
MAX_TOKENS=${MAX_TOKENS:-4096}
MAX_UPDATE=${MAX_UPDATE:-50000}
LR=${LR:-2e-3}
WARMUP=${WARMUP:-16000}
SEED=${SEED:-1}
case "$ARCH" in *postnorm*) BETA2=${BETA2:-0.98} ;; *) BETA2=${BETA2:-0.997} ;; esac
PRECISION=${PRECISION:-}
NUM_GPUS=${NUM_GPUS:-$(python -c 'import torch; print(torch.cuda.device_count())')}
DEVICE_ARGS=()
if [ "$NUM_GPUS" -eq 0 ]; then
    echo "warning: no GPU found; training on the CPU (only sensible for a smoke test)" >&2
    DEVICE_ARGS=(--cpu)
    NUM_GPUS=1
fi
UPDATE_FREQ=${UPDATE_FREQ:-$(( 16 / NUM_GPUS > 0 ? 16 / NUM_GPUS : 1 ))}
echo "tokens per update: ${MAX_TOKENS} x ${UPDATE_FREQ} x ${NUM_GPUS} = $(( MAX_TOKENS * UPDATE_FREQ * NUM_GPUS )) (paper: 65536)"

mkdir -p "$SAVE_DIR"
# fairseq-deep-train is fairseq-train with --user-dir set to the installed fairseq_deep.
fairseq-deep-train "$DATA_BIN" "${DEVICE_ARGS[@]}" \
    --arch "$ARCH" --share-all-embeddings \
    --optimizer adam --adam-betas "(0.9, $BETA2)" --adam-eps 1e-8 --clip-norm 0.0 --weight-decay 0.0 \
    --lr "$LR" --lr-scheduler inverse_sqrt --warmup-init-lr 1e-7 --warmup-updates "$WARMUP" \
    --criterion label_smoothed_cross_entropy --label-smoothing 0.1 --dropout 0.1 \
    --max-tokens "$MAX_TOKENS" --update-freq "$UPDATE_FREQ" --max-update "$MAX_UPDATE" \
    --save-dir "$SAVE_DIR" --save-interval 1 --keep-last-epochs 10 \
    --seed "$SEED" --log-format simple --log-interval 100 $PRECISION \
    "$@" 2>&1 | tee -a "$SAVE_DIR/train.log"
exit "${PIPESTATUS[0]}"
