"""fairseq_deep optim; each module registers itself with fairseq when imported (see fairseq_deep/__init__.py)."""
