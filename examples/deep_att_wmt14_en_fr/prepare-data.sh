#!/usr/bin/env bash
# WMT'14 English-French as in Zhou et al. (2016), Sec. 4.1: the full WMT'14 parallel corpus
# (Europarl v7, Common Crawl, UN, News Commentary v9, Gigaword fr-en; about 36M pairs),
# newstest2012 + newstest2013 as development set, newstest2014 as test set; Moses tokenization
# (the paper scores tokenized, case-sensitive BLEU with multi-bleu.perl); word vocabularies of the
# 200K most frequent English and 80K most frequent French words, everything else <unk>.
#
#   bash prepare-data.sh [DEST=data-bin/wmt14_en_fr_words]
#
# Needs the internet (about 8 GB) unless ORIG holds the archives already.  Environment:
#   ORIG (orig), WORK (wmt14_en_fr_words), WORKERS (8),
#   NWORDS_SRC (200000), NWORDS_TGT (80000): use 30000 / 30000 for the 12M-pair setting of Table 1,
#   MAX_LEN (80): drop training pairs longer than this many tokens (the paper gives no limit;
#   long pairs cost memory, not accuracy).
set -euo pipefail

DEST=${1:-data-bin/wmt14_en_fr_words}
ORIG=${ORIG:-orig}
WORK=${WORK:-wmt14_en_fr_words}
WORKERS=${WORKERS:-8}
NWORDS_SRC=${NWORDS_SRC:-200000}
NWORDS_TGT=${NWORDS_TGT:-80000}
MAX_LEN=${MAX_LEN:-80}

if [ ! -d mosesdecoder ]; then
    git clone --depth 1 https://github.com/moses-smt/mosesdecoder.git
fi
SCRIPTS=mosesdecoder/scripts
TOK="perl $SCRIPTS/tokenizer/tokenizer.perl -threads $WORKERS -a -no-escape"
NORM="perl $SCRIPTS/tokenizer/normalize-punctuation.perl"
NONPRINT="perl $SCRIPTS/tokenizer/remove-non-printing-char.perl"
CLEAN="perl $SCRIPTS/training/clean-corpus-n.perl"

URLS=(
    http://statmt.org/wmt13/training-parallel-europarl-v7.tgz
    http://statmt.org/wmt13/training-parallel-commoncrawl.tgz
    http://statmt.org/wmt13/training-parallel-un.tgz
    http://statmt.org/wmt14/training-parallel-nc-v9.tgz
    http://statmt.org/wmt10/training-giga-fren.tar
    http://statmt.org/wmt14/dev.tgz
    http://statmt.org/wmt14/test-full.tgz
)
CORPORA=(
    training/europarl-v7.fr-en
    commoncrawl.fr-en
    un/undoc.2000.fr-en
    training/news-commentary-v9.fr-en
    giga-fren.release2.fixed
)

mkdir -p "$ORIG" "$WORK"
(
    cd "$ORIG"
    for url in "${URLS[@]}"; do
        file=$(basename "$url")
        [ -f "$file" ] || wget -q "$url"
        case "$file" in
            *.tgz) tar xzf "$file" ;;
            *.tar) tar xf "$file" ;;
        esac
    done
    for f in giga-fren.release2.fixed.*.gz; do [ -f "$f" ] && gunzip -f "$f"; done
)

for l in en fr; do
    : > "$WORK/train.raw.$l"
    for c in "${CORPORA[@]}"; do
        $NORM $l < "$ORIG/$c.$l" | $NONPRINT | $TOK -l $l >> "$WORK/train.raw.$l"
    done
    cat "$ORIG/dev/newstest2012.$l" "$ORIG/dev/newstest2013.$l" | $NORM $l | $NONPRINT \
        | $TOK -l $l > "$WORK/valid.$l"
    side=$([ $l = en ] && echo src || echo ref)
    grep '<seg id' "$ORIG/test-full/newstest2014-fren-$side.$l.sgm" \
        | sed -e 's/<seg id="[0-9]*">\s*//g' -e 's/\s*<\/seg>\s*//g' \
        | $NORM $l | $NONPRINT | $TOK -l $l > "$WORK/test.$l"
done
$CLEAN "$WORK/train.raw" en fr "$WORK/train" 1 "$MAX_LEN"

# Word vocabularies (Sec. 4.1): the most frequent NWORDS_SRC / NWORDS_TGT words, the rest <unk>.
fairseq-preprocess --source-lang en --target-lang fr \
    --trainpref "$WORK/train" --validpref "$WORK/valid" --testpref "$WORK/test" \
    --nwordssrc "$NWORDS_SRC" --nwordstgt "$NWORDS_TGT" \
    --destdir "$DEST" --workers "$WORKERS"
# The tokenized references for scoring (no <unk>):
cp "$WORK/test.fr" "$DEST/test.ref.fr"
cp "$WORK/valid.fr" "$DEST/valid.ref.fr"
echo "binarized data in $DEST"
