#!/usr/bin/env bash
# WMT16 English-German as in Wang et al. (2019), Sec. 4.1, and Vaswani et al. (2017): the 4.5M
# sentence pairs preprocessed by Google (tokenized, joint BPE with 32k merge operations, shared
# vocabulary), newstest2013 for validation and newstest2014 for test; binarized with one joined
# dictionary (needed by --share-all-embeddings), tokens seen fewer than 5 times dropped (footnote 8).
#
#   bash prepare-data.sh [DEST=data-bin/wmt16_en_de_bpe32k]
#
# Needs the internet (about 480 MB) unless WMT16_TGZ points at a downloaded wmt16_en_de.tar.gz.
# Environment: WORK (where the archive is unpacked, default wmt16_en_de), WORKERS (default 8).
set -euo pipefail

DEST=${1:-data-bin/wmt16_en_de_bpe32k}
WORK=${WORK:-wmt16_en_de}
WORKERS=${WORKERS:-8}
TGZ=${WMT16_TGZ:-$WORK/wmt16_en_de.tar.gz}
GDRIVE_ID=0B_bZck-ksdkpM25jRUN2X2UxMm8   # the link of the paper's footnote 7 and of the authors' code
URL="https://drive.usercontent.google.com/download?id=${GDRIVE_ID}&export=download&confirm=t"

mkdir -p "$WORK"
if [ ! -s "$TGZ" ]; then
    echo "downloading the preprocessed WMT16 En-De corpus to $TGZ"
    if command -v gdown >/dev/null 2>&1; then
        gdown "$GDRIVE_ID" -O "$TGZ"
    else
        curl -fL --retry 3 -o "$TGZ" "$URL"
    fi
fi
if ! gzip -t "$TGZ" 2>/dev/null; then
    echo "error: $TGZ is not a gzip archive (Google Drive may have sent an HTML page, e.g. when its" >&2
    echo "download quota is exceeded). Download wmt16_en_de.tar.gz by hand from" >&2
    echo "https://drive.google.com/uc?export=download&id=${GDRIVE_ID} and set WMT16_TGZ=<file>." >&2
    exit 1
fi
tar -xzf "$TGZ" -C "$WORK"

for f in train.tok.clean.bpe.32000 newstest2013.tok.bpe.32000 newstest2014.tok.bpe.32000; do
    for l in en de; do
        [ -s "$WORK/$f.$l" ] || { echo "error: $WORK/$f.$l is missing after unpacking $TGZ" >&2; exit 1; }
    done
done
echo "train: $(wc -l < "$WORK/train.tok.clean.bpe.32000.en") pairs;" \
     "valid (newstest2013): $(wc -l < "$WORK/newstest2013.tok.bpe.32000.en");" \
     "test (newstest2014): $(wc -l < "$WORK/newstest2014.tok.bpe.32000.en")"

# --joined-dictionary builds one dictionary from both sides; its frequency threshold is --thresholdsrc.
fairseq-preprocess --source-lang en --target-lang de \
    --trainpref "$WORK/train.tok.clean.bpe.32000" \
    --validpref "$WORK/newstest2013.tok.bpe.32000" \
    --testpref "$WORK/newstest2014.tok.bpe.32000" \
    --destdir "$DEST" --joined-dictionary --thresholdsrc 5 --workers "$WORKERS"

echo "binarized data in $DEST; test references (BPE) in $WORK/newstest2014.tok.bpe.32000.de"
