"""fairseq_deep tasks; each task registers itself with fairseq when imported (see
fairseq_deep/__init__.py); beside them what the task computes for its logs (grad_norm.py: r_t)."""
