#!/usr/bin/env bash
# Dou et al. (2018), Sec. 4.1: WMT14 En-De, Transformer-Base baseline, then the proposed models
# initialised from it.  Stages: prepare | baseline | agg | eval  (default: all, in that order).
#
#   RAW=/data/wmt14_en_de bash run.sh              # the real setup (see README.md)
#   SMOKE=1 bash run.sh                             # a 2-minute CPU run on the synthetic corpus
#
# Variables: RAW (raw text: train.{en,de}, valid.{en,de} = newstest2013, test.{en,de} = newstest2014),
# WORK (outputs), ARCH (transformer_hier_agg; any preset of the README, section "Layer aggregation"), BIG=1
# (Transformer-Big: the *_big presets), LAMBDA (diversity weight, 1.0; 0 = no regulariser),
# GPUS, UPDATE_FREQ, BASE_UPDATES, AGG_UPDATES, BEAM, LENPEN.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PLUGIN="$(cd "$HERE/../../fairseq_deep" && pwd)"
STAGES="${*:-prepare baseline agg eval}"
WORK="${WORK:-$PWD/wmt14_en_de_agg}"
ARCH="${ARCH:-transformer_hier_agg}"
LAMBDA="${LAMBDA:-1.0}"
SRC=en; TGT=de
SUFFIX=""; [[ "${BIG:-0}" == 1 ]] && SUFFIX="_big"
BASE_ARCH="transformer_agg_baseline$SUFFIX"; AGG_ARCH="$ARCH$SUFFIX"
# paper: 8 GPUs x 4096 tokens; fewer GPUs keep the batch with --update-freq
GPUS="${GPUS:-8}"; UPDATE_FREQ="${UPDATE_FREQ:-$(( 8 / GPUS > 0 ? 8 / GPUS : 1 ))}"
BASE_UPDATES="${BASE_UPDATES:-100000}"; AGG_UPDATES="${AGG_UPDATES:-100000}"
COMMON=(--optimizer adam --adam-betas '(0.9, 0.98)' --clip-norm 0.0 --lr 7e-4 --lr-scheduler inverse_sqrt
        --warmup-updates 4000 --warmup-init-lr 1e-07 --weight-decay 0.0 --label-smoothing 0.1
        --max-tokens 4096 --update-freq "$UPDATE_FREQ" --share-all-embeddings --save-interval-updates 5000
        --keep-interval-updates 10 --no-epoch-checkpoints --log-format simple --log-interval 100)
DEVICE=()
GEN=(--beam "${BEAM:-4}" --lenpen "${LENPEN:-0.6}" --max-tokens 8000 --remove-bpe sentencepiece)
if [[ "${SMOKE:-0}" == 1 ]]; then  # tiny model, synthetic data, CPU
  SRC=src; TGT=tgt; WORK="${WORK%/}_smoke"; BASE_UPDATES=30; AGG_UPDATES=20
  COMMON=(--optimizer adam --lr 1e-3 --label-smoothing 0.1 --max-tokens 1000 --share-all-embeddings
          --no-epoch-checkpoints --log-format simple --log-interval 10 --encoder-layers 2 --decoder-layers 3
          --encoder-embed-dim 32 --decoder-embed-dim 32 --encoder-ffn-embed-dim 64 --decoder-ffn-embed-dim 64
          --encoder-attention-heads 2 --decoder-attention-heads 2 --num-workers 0)
  DEVICE=(--cpu); GEN=(--beam 2 --max-tokens 2000)
fi
BIN="$WORK/bin"

for stage in $STAGES; do case "$stage" in
prepare)
  mkdir -p "$WORK"
  if [[ "${SMOKE:-0}" == 1 ]]; then
    python -c "from fairseq_deep.data.synthetic import write_corpus; write_corpus('$WORK/raw', 3000, 100, 100)"
    fairseq-preprocess --source-lang $SRC --target-lang $TGT --trainpref "$WORK/raw/train" \
      --validpref "$WORK/raw/valid" --testpref "$WORK/raw/test" --destdir "$BIN" --joined-dictionary --workers 2
    continue
  fi
  : "${RAW:?set RAW to the folder of train/valid/test.{en,de} (README.md)}"
  mkdir -p "$WORK/spm"
  # joint BPE of 32K operations (Sec. 4.1), here a sentencepiece BPE model of 32K pieces
  spm_train --input="$RAW/train.$SRC,$RAW/train.$TGT" --model_prefix="$WORK/spm/bpe" --vocab_size=32000 \
    --model_type=bpe --character_coverage=1.0 --input_sentence_size=10000000 --shuffle_input_sentence=true
  for split in train valid test; do for l in $SRC $TGT; do
    spm_encode --model="$WORK/spm/bpe.model" < "$RAW/$split.$l" > "$WORK/spm/$split.$l"
  done; done
  fairseq-preprocess --source-lang $SRC --target-lang $TGT --trainpref "$WORK/spm/train" \
    --validpref "$WORK/spm/valid" --testpref "$WORK/spm/test" --destdir "$BIN" --joined-dictionary --workers 8
  ;;
baseline)  # row 1 of Table 1: the pre-trained model the proposed ones start from
  fairseq-train "$BIN" --user-dir "$PLUGIN" --task translation --arch "$BASE_ARCH" "${COMMON[@]}" "${DEVICE[@]}" \
    --criterion label_smoothed_cross_entropy --max-update "$BASE_UPDATES" --save-dir "$WORK/ckpt/$BASE_ARCH"
  ;;
agg)  # the proposed model, every matching parameter from the baseline, the new ones fresh (logged)
  fairseq-train "$BIN" --user-dir "$PLUGIN" --task translation --arch "$AGG_ARCH" "${COMMON[@]}" "${DEVICE[@]}" \
    --finetune-from-model "$WORK/ckpt/$BASE_ARCH/checkpoint_best.pt" --init-from-pretrained \
    --criterion label_smoothed_cross_entropy_with_diversity --diversity-lambda "$LAMBDA" \
    --max-update "$AGG_UPDATES" --save-dir "$WORK/ckpt/$AGG_ARCH"
  ;;
eval)
  for arch in "$BASE_ARCH" "$AGG_ARCH"; do
    fairseq-generate "$BIN" --user-dir "$PLUGIN" --path "$WORK/ckpt/$arch/checkpoint_best.pt" \
      --gen-subset test "${GEN[@]}" "${DEVICE[@]}" > "$WORK/$arch.test.out"
    tail -n 1 "$WORK/$arch.test.out"
  done
  ;;
*) echo "unknown stage $stage (prepare | baseline | agg | eval)" >&2; exit 2 ;;
esac; done
