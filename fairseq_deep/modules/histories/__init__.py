"""Layer histories and readouts: what layer l+1 reads and what a stack returns (DLCL, the
aggregations, transparent attention, multi-layer attention)."""
