"""The parts models are built of, in four folders by job (docs/design.md, "Layout"): ``common/``
(what every job shares), ``histories/`` (what layer l+1 reads, what a stack returns), ``schemes/``
(residual, norm and stream-level schemes) and ``recurrent/`` (cells, attention, their Triton loops).
It imports none of them: a module imports what it needs from its folder."""
