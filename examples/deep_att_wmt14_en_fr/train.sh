#!/usr/bin/env bash
# Train Deep-Att (or Deep-ED) as in Zhou et al. (2016), Sec. 4.2-4.3:
#   * embeddings 256, 512 cells, n_e = 9 (two interleaved columns), n_d = 7 (--arch deep_att_ff);
#   * dropout p_d = 0.1 on the LSTM outputs h;
#   * recurrent parameters zero at init, everything else N(0, 0.07^2) (the model's default);
#   * Adam (Sec. 3.2) with two learning rates, l_r = 5e-4 for W_r and theta, l_f = 4e-5 for all
#     else, and the L2 of Eq. 12 with r = 2 on all but the embeddings, held fixed for the whole run
#     (--optimizer deep_att, --lr-scheduler fixed);
#   * 500-800 sentences per batch (here --batch-size 640, capped by --max-tokens per GPU);
#   * about 7 passes over the data (10 days at 1.5 days a pass on 16-32 K40s).
#
#   bash train.sh DATA_BIN SAVE_DIR [extra fairseq-train flags]
#
# Environment: ARCH (deep_att_ff; deep_ed_ff, deep_att_ff_uni, deep_att_ff_5x3, deep_att_noff_2x2,
# ... see the README, section deep_att), SEED (1: train three seeds for the ensemble of Sec. 4.4.2),
# MAX_TOKENS (16000 per GPU), UPDATE_FREQ (1), MAX_EPOCH (7).
set -euo pipefail

if [ $# -lt 2 ]; then
    sed -n '2,18p' "$0"
    exit 2
fi
DATA_BIN=$1
SAVE_DIR=$2
shift 2
ARCH=${ARCH:-deep_att_ff}
SEED=${SEED:-1}
MAX_TOKENS=${MAX_TOKENS:-16000}
UPDATE_FREQ=${UPDATE_FREQ:-1}
MAX_EPOCH=${MAX_EPOCH:-7}
DEVICE_ARGS=()
if [ "$(python -c 'import torch; print(torch.cuda.device_count())')" -eq 0 ]; then
    DEVICE_ARGS=(--cpu)
fi

fairseq-deep-train "$DATA_BIN" "${DEVICE_ARGS[@]}" \
    --task translation --source-lang en --target-lang fr \
    --arch "$ARCH" --dropout 0.1 \
    --optimizer deep_att --deep-att-update-rule adam --lr 4e-5 --deep-att-lr-recurrent 5e-4 --l2-strength 2 \
    --lr-scheduler fixed --clip-norm 0 \
    --criterion cross_entropy \
    --batch-size 640 --max-tokens "$MAX_TOKENS" --update-freq "$UPDATE_FREQ" \
    --max-epoch "$MAX_EPOCH" --seed "$SEED" \
    --save-dir "$SAVE_DIR" --keep-last-epochs 3 --save-interval-updates 10000 \
    --keep-interval-updates 5 \
    --log-format simple --log-interval 100 "$@"
