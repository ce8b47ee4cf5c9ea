"""Diagnostics: training plots (of the gradient-norm ratio that the task measures with
:mod:`fairseq_deep.tasks.grad_norm`), export and plots of learned layer weights
(Wang et al. 2019, Fig. 5; Bapna et al. 2018, Fig. 1-4), and the layer exploitation score s_j of
aggregation models (Dou et al. 2018, Eq. 11, ``python -m fairseq_deep.diagnostics.exploitation``)."""
