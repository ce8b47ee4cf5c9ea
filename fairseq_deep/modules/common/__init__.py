"""What the modules of every job share: the declarations of growth rules, the beam's reorder of
cached state, the kinds of learned layer-weight matrices, the float32 rule of loops under half
precision."""
