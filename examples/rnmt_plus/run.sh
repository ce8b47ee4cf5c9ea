#!/usr/bin/env bash
# Recipes of Chen et al. (2018), "The Best of Both Worlds": Table 2 (WMT'14 En-De) and Tables 5-6
# (hybrids), with the paper's hyper-parameters (App. A.2-A.6).  Usage:
#
#   DATA=data-bin/wmt14_en_de GPUS=8 bash examples/rnmt_plus/run.sh MODEL [extra fairseq-train flags]
#
# MODEL: rnmt_plus | rnmt_plus_enfr | transformer_base | transformer_big | conv_s2s |
#        hybrid_transformer_rnmt | hybrid_rnmt_transformer | hybrid_cascaded | hybrid_multicolumn
# hybrid_cascaded needs RNMT_CKPT (a trained rnmt_plus); hybrid_multicolumn needs RNMT_CKPT and
# TRANS_CKPT (a trained hybrid_transformer_rnmt).  The paper trains on 16-32 GPUs: the global batch
# is kept with --update-freq (set GPUS to the number of GPUs you have).  PAIR=en_de (default) or
# en_fr picks the hybrids' per-pair hyper-parameters (Table 5 is En-Fr only: PAIR=en_fr).
set -euo pipefail
MODEL=${1:?model}; shift
DATA=${DATA:?set DATA to a fairseq-preprocess output (joined dictionary)}
GPUS=${GPUS:-1}
SAVE=${SAVE:-checkpoints/$MODEL}
COMMON=(--task translation_deep --save-dir "$SAVE" --keep-last-epochs 5 --log-format simple
        --log-interval 100)
# Separate source, target and output embeddings, as in Chen et al. Table 3 (RNMT+ 378.9M, Transformer
# Big 375.4M: here 379.8M and 375.4M with a 32k vocabulary; --share-all-embeddings gives 283.5M for
# RNMT+).  Append --share-all-embeddings to trade that for a smaller model (joined dictionary).
ADAM=(--optimizer adam --adam-betas "(0.9, 0.999)" --adam-eps 1e-6)   # Sec. 4.1
# RNMT+: 4096 sentence pairs per batch (Sec. 5.1), here 128 per GPU x update-freq.
RNMT_BATCH=(--batch-size 128 --max-tokens 12000 --update-freq $(( (4096 + 128 * GPUS - 1) / (128 * GPUS) )))
# Transformer: 65536 source and target tokens per batch.
TRANS_BATCH=(--max-tokens 4096 --update-freq $(( (16 + GPUS - 1) / GPUS )))
# Sec. 4.1: sentence-level CE, label smoothing 0.1, adaptive clipping; Eq. 1 with n = 32 replicas.
RNMT_TRAIN=(--criterion sentence_cross_entropy --label-smoothing 0.1 --adaptive-clip
            --lr-scheduler rnmt_plus --rnmt-replicas 32 --warmup-updates 500)
PAIR=${PAIR:-en_de}
# Hybrids (App. A.4-A.5): each component keeps its own model's dropouts.  Transformer Big (A.2):
# En-De residual + input 0.3, no attention/ReLU dropout; En-Fr all four 0.1.  RNMT+ (A.3): all its
# dropouts (embeddings, layer outputs, attention) 0.3 En-De, 0.2 En-Fr.
case "$PAIR" in
  en_de) HYBRID_DROPOUT=(--hybrid-transformer-dropout 0.3 --attention-dropout 0 --activation-dropout 0
                         --hybrid-rnmt-dropout 0.3 --hybrid-rnmt-attention-dropout 0.3) ;;
  en_fr) HYBRID_DROPOUT=(--hybrid-transformer-dropout 0.1 --attention-dropout 0.1 --activation-dropout 0.1
                         --hybrid-rnmt-dropout 0.2 --hybrid-rnmt-attention-dropout 0.2) ;;
  *) echo "PAIR must be en_de or en_fr, got $PAIR" >&2; exit 2 ;;
esac
noam() {  # Eq. 2 (App. A.2): r0, p, d_model
  echo --lr-scheduler noam --noam-r0 "$1" --warmup-updates "$2" --noam-d-model "$3"
}

case "$MODEL" in
  rnmt_plus)       # Table 2, En-De (App. A.3): dropout 0.3, L2 1e-5, s = 600k, e = 1.2M
    fairseq-train "$DATA" --user-dir fairseq_deep "${COMMON[@]}" --arch rnmt_plus --dropout 0.3 \
      "${ADAM[@]}" "${RNMT_TRAIN[@]}" --rnmt-decay-start 600000 --rnmt-decay-end 1200000 \
      --l2-regularization 1e-5 "${RNMT_BATCH[@]}" "$@" ;;
  rnmt_plus_enfr)  # Table 1, En-Fr (App. A.3): dropout 0.2, no weight decay, s = 1.2M, e = 3.6M
    fairseq-train "$DATA" --user-dir fairseq_deep "${COMMON[@]}" --arch rnmt_plus --dropout 0.2 \
      "${ADAM[@]}" "${RNMT_TRAIN[@]}" --rnmt-decay-start 1200000 --rnmt-decay-end 3600000 \
      "${RNMT_BATCH[@]}" "$@" ;;
  transformer_base)  # Table 2 (App. A.2, En-De): all dropouts 0.1, r0 = 2.0, p = 8000
    fairseq-train "$DATA" --user-dir fairseq_deep "${COMMON[@]}" --arch transformer_prenorm \
      --dropout 0.1 --attention-dropout 0.1 --activation-dropout 0.1 "${ADAM[@]}" $(noam 2.0 8000 512) \
      --criterion label_smoothed_cross_entropy --label-smoothing 0.1 "${TRANS_BATCH[@]}" "$@" ;;
  transformer_big)   # Table 2 (App. A.2, En-De): residual + input dropout 0.3, r0 = 3.0, p = 40000
    fairseq-train "$DATA" --user-dir fairseq_deep "${COMMON[@]}" --arch transformer_prenorm_big \
      --encoder-ffn-embed-dim 8192 --decoder-ffn-embed-dim 8192 --dropout 0.3 --attention-dropout 0 \
      --activation-dropout 0 "${ADAM[@]}" $(noam 3.0 40000 1024) \
      --criterion label_smoothed_cross_entropy --label-smoothing 0.1 "${TRANS_BATCH[@]}" "$@" ;;
  conv_s2s)          # Table 2 (fairseq's own ConvS2S; not the paper's 15-layer variant of App. A.1)
    fairseq-train "$DATA" --user-dir fairseq_deep "${COMMON[@]}" --arch fconv_wmt_en_de --dropout 0.2 \
      --optimizer nag --lr 0.5 --clip-norm 0.1 --criterion label_smoothed_cross_entropy \
      --label-smoothing 0.1 --max-tokens 4000 "$@" ;;
  hybrid_transformer_rnmt)  # Table 5 (App. A.4, En-Fr): Eq. 2 with r0 = 4.0, p = 50000
    fairseq-train "$DATA" --user-dir fairseq_deep "${COMMON[@]}" \
      --arch hybrid_transformer_rnmt "${HYBRID_DROPOUT[@]}" "${ADAM[@]}" $(noam 4.0 50000 1024) --adaptive-clip \
      --criterion sentence_cross_entropy --label-smoothing 0.1 "${RNMT_BATCH[@]}" "$@" ;;
  hybrid_rnmt_transformer)  # Table 5 (App. A.4, En-Fr): Eq. 2 with r0 = 3.0, p = 40000
    fairseq-train "$DATA" --user-dir fairseq_deep "${COMMON[@]}" \
      --arch hybrid_rnmt_transformer "${HYBRID_DROPOUT[@]}" "${ADAM[@]}" $(noam 3.0 40000 1024) --adaptive-clip \
      --criterion label_smoothed_cross_entropy --label-smoothing 0.1 "${TRANS_BATCH[@]}" "$@" ;;
  hybrid_cascaded)   # Table 6 (App. A.5): 4 Transformer layers on a frozen pre-trained 6-layer RNMT+,
                     # Eq. 2 with r0 = 2.0, p = 16000, L2 1e-5 (the paper: on the decoder only)
    fairseq-train "$DATA" --user-dir fairseq_deep "${COMMON[@]}" \
      --arch hybrid_cascaded --encoder-layers 4 --rnmt-encoder-layers 6 \
      --hybrid-pretrained "${RNMT_CKPT:?set RNMT_CKPT}" --hybrid-freeze-pretrained "${HYBRID_DROPOUT[@]}" \
      "${ADAM[@]}" $(noam 2.0 16000 1024) --adaptive-clip --criterion sentence_cross_entropy \
      --label-smoothing 0.1 --l2-regularization 1e-5 "${RNMT_BATCH[@]}" "$@" ;;
  hybrid_multicolumn)  # Table 6 (App. A.6): pre-trained RNMT+ and Transformer columns, 16 GPUs;
    # En-De: Eq. 1 with p = 50, s = 300k, e = 900k, all dropouts 0.3, L2 1e-5;
    # En-Fr: Eq. 2 with r0 = 1.0, p = 10000, no weight decay, no dropout.
    if [ "$PAIR" = en_de ]; then
      MC=(--lr-scheduler rnmt_plus --rnmt-replicas 16 --warmup-updates 50 --rnmt-decay-start 300000
          --rnmt-decay-end 900000 --dropout 0.3 --attention-dropout 0.3 --activation-dropout 0.3
          --l2-regularization 1e-5)
    else
      MC=($(noam 1.0 10000 1024) --dropout 0 --attention-dropout 0 --activation-dropout 0)
    fi
    fairseq-train "$DATA" --user-dir fairseq_deep "${COMMON[@]}" \
      --arch hybrid_multicolumn --hybrid-columns rnmt,transformer \
      --hybrid-pretrained "${RNMT_CKPT:?set RNMT_CKPT},${TRANS_CKPT:?set TRANS_CKPT}" \
      "${ADAM[@]}" --criterion sentence_cross_entropy --label-smoothing 0.1 --adaptive-clip "${MC[@]}" \
      "${RNMT_BATCH[@]}" "$@" ;;
  *) echo "unknown model $MODEL" >&2; exit 2 ;;
esac
