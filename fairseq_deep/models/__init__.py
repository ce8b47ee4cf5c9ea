"""Model families of fairseq_deep; each module registers its architectures when imported."""
