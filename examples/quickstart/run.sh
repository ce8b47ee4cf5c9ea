#!/usr/bin/env bash
# The quickstart: synthetic corpus -> sentencepiece -> fairseq-preprocess -> fairseq-train
# (small pre-norm DLCL) -> fairseq-generate -> sacreBLEU.  About 5 minutes on 2 CPU cores.
#   bash examples/quickstart/run.sh [WORKDIR] [more options of python -m fairseq_deep.quickstart]
set -euo pipefail
WORKDIR=${1:-quickstart_run}
shift || true
exec python -m fairseq_deep.quickstart --workdir "$WORKDIR" "$@"
