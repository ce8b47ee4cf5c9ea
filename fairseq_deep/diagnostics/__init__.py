"""Diagnostics: gradient-norm ratio, training plots, and export and plots of learned layer weights
(Wang et al. 2019, Fig. 5; Bapna et al. 2018, Fig. 1-4)."""
