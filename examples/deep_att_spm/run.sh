#!/usr/bin/env bash
# Deep-Att (Zhou et al. 2016) on sentencepiece data: any parallel corpus of raw (untokenized) text.
# One joint sentencepiece model replaces the word vocabularies of Sec. 4.1 (no <unk> post-processing
# needed); the model and training technique are those of Sec. 4.2-4.3 (train.sh of
# ../deep_att_wmt14_en_fr); generation with beam 3 and total log-likelihood ranking (Sec. 3.3);
# detokenized sacreBLEU on the test split.
#
#   bash run.sh RAW_PREFIX_DIR SRC TGT WORK_DIR
#
# RAW_PREFIX_DIR holds train.SRC, train.TGT, valid.*, test.* (one sentence per line).
# Environment: VOCAB (16000 pieces, joint), ARCH (deep_att_ff), SEEDS ("1": several seeds are
# trained and ensembled, e.g. "1 2 3"), TRAIN_FLAGS (extra fairseq-train flags, e.g.
# "--max-epoch 10 --max-tokens 8000"), GEN_FLAGS, BEAM (3).
# Smoke test on a laptop: VOCAB=200 TRAIN_FLAGS="--encoder-layers 2 --decoder-layers 2
#   --encoder-hidden-size 32 --decoder-hidden-size 32 --encoder-embed-dim 16
#   --decoder-embed-dim 16 --max-update 20 --lr 1e-3 --deep-att-lr-recurrent 1e-2" bash run.sh ...
set -euo pipefail

if [ $# -lt 4 ]; then
    sed -n '2,18p' "$0"
    exit 2
fi
RAW=$1
SRC=$2
TGT=$3
WORK=$4
VOCAB=${VOCAB:-16000}
ARCH=${ARCH:-deep_att_ff}
SEEDS=${SEEDS:-1}
BEAM=${BEAM:-3}
TRAIN_FLAGS=${TRAIN_FLAGS:-}
GEN_FLAGS=${GEN_FLAGS:-}
DEVICE_ARGS=()
if [ "$(python -c 'import torch; print(torch.cuda.device_count())')" -eq 0 ]; then
    DEVICE_ARGS=(--cpu)
fi
mkdir -p "$WORK/spm"

# 1. A joint sentencepiece model, and every split encoded into pieces.
python - "$RAW" "$SRC" "$TGT" "$WORK/spm" "$VOCAB" <<'PY'
import sys
import sentencepiece as spm
raw, src, tgt, out, vocab = sys.argv[1:]
spm.SentencePieceTrainer.train(
    input=f"{raw}/train.{src},{raw}/train.{tgt}", model_prefix=f"{out}/spm", vocab_size=int(vocab),
    character_coverage=1.0, model_type="unigram", input_sentence_size=5000000,
    shuffle_input_sentence=True, hard_vocab_limit=False, minloglevel=2)
sp = spm.SentencePieceProcessor(model_file=f"{out}/spm.model")
for split in ("train", "valid", "test"):
    for lang in (src, tgt):
        with open(f"{raw}/{split}.{lang}", encoding="utf-8") as fin, \
                open(f"{out}/{split}.{lang}", "w", encoding="utf-8") as fout:
            for line in fin:
                fout.write(" ".join(sp.encode(line.strip(), out_type=str)) + "\n")
PY

# 2. Binarize with one joined dictionary of pieces.
fairseq-preprocess --source-lang "$SRC" --target-lang "$TGT" \
    --trainpref "$WORK/spm/train" --validpref "$WORK/spm/valid" --testpref "$WORK/spm/test" \
    --joined-dictionary --destdir "$WORK/bin" --workers 4

# 3. Train (Sec. 4.3: Adam, l_f = 4e-5, l_r = 5e-4, L2 r = 2 except embeddings, dropout 0.1).
CKPTS=()
for SEED in $SEEDS; do
    # shellcheck disable=SC2086
    fairseq-deep-train "$WORK/bin" "${DEVICE_ARGS[@]}" --task translation \
        --source-lang "$SRC" --target-lang "$TGT" --arch "$ARCH" --dropout 0.1 \
        --optimizer deep_att --deep-att-update-rule adam --lr 4e-5 --deep-att-lr-recurrent 5e-4 --l2-strength 2 \
        --lr-scheduler fixed --criterion cross_entropy --max-tokens 8000 --seed "$SEED" \
        --save-dir "$WORK/ckpt.seed$SEED" --no-epoch-checkpoints \
        --log-format simple --log-interval 50 $TRAIN_FLAGS
    CKPTS+=("$WORK/ckpt.seed$SEED/checkpoint_best.pt")
done
PATHS=$(IFS=:; echo "${CKPTS[*]}")

# 4. Translate the test split (beam 3, no length normalisation; ensemble if several seeds) and
#    score with sacreBLEU (BLEU, chrF) against the raw references: fairseq-deep-score puts the
#    detokenized hypotheses back in input order and stops when one is missing.
# shellcheck disable=SC2086
fairseq-deep-generate "$WORK/bin" "${DEVICE_ARGS[@]}" --task translation \
    --source-lang "$SRC" --target-lang "$TGT" --path "$PATHS" --gen-subset test \
    --beam "$BEAM" --unnormalized --batch-size 64 --post-process sentencepiece \
    $GEN_FLAGS > "$WORK/generate-test.out"
fairseq-deep-score "$WORK/generate-test.out" --ref "$RAW/test.$TGT" --out "$WORK/test.hyp.$TGT" \
    | tee "$WORK/test.bleu"
