"""Residual, layer-norm and stream-level schemes: how a layer adds its sublayers to their input,
where its norms are, what a stack's residual stream is."""
