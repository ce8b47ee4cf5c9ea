#!/usr/bin/env bash
# Train a Transformer of one of the deep schemes (DeepNorm, Admin, ReZero, DS-Init, B2T, Sub-LN,
# Peri-LN, Mix-LN, DyT, LayerScale; DenseFormer, hyper-connections, mHC, ResiDual, ODE Transformer)
# on WMT16 En-De (the data of
# examples/wmt16_en_de_dlcl/prepare-data.sh), with the training script of that recipe:
#
#   ARCH=transformer_deepnorm_100l bash train.sh DATA_BIN [SAVE_DIR] [extra fairseq-train options]
#
# Defaults here: ARCH transformer_deepnorm_18l, LR 5e-4, WARMUP 4000, Adam beta2 0.98 (fairseq's
# post-norm Transformer recipe; the schemes' papers tune their own schedules, see README.md), and
# the 65,536 tokens per update of the DLCL recipe. Every variable of ../wmt16_en_de_dlcl/train.sh
# (MAX_TOKENS, UPDATE_FREQ, MAX_UPDATE, PRECISION, ...) works here too.
set -euo pipefail
if [ $# -lt 1 ]; then
    sed -n '2,11p' "$0"
    exit 2
fi
export ARCH=${ARCH:-transformer_deepnorm_18l} LR=${LR:-5e-4} WARMUP=${WARMUP:-4000} BETA2=${BETA2:-0.98}
if [ $# -lt 2 ]; then
    set -- "$1" "checkpoints/wmt16_en_de_${ARCH}"
fi
exec bash "$(dirname "${BASH_SOURCE[0]}")/../wmt16_en_de_dlcl/train.sh" "$@"
