"""--adaptive-clip-variant lingvo is lingvo's GradNormTracker step for step (issue 15, audit item 5)."""

import math
import random

import pytest

from fairseq_deep.optim.adaptive_clip import GradNormTracker


def lingvo_reference(norms, decay=0.995, threshold=4.0, lower_cap=1e-2):
    """lingvo/core/layers.py GradNormTracker.FProp transcribed: EMA variables updated in place."""
    log_mean = log_mean_sq = total_weight = 0.0
    decisions = []
    for norm in norms:
        g = max(norm, lower_cap)
        mean = log_mean / max(total_weight, 1e-6)
        var = log_mean_sq / max(total_weight, 1e-6) - mean * mean
        std = math.sqrt(max(var, 1e-6))
        x = math.log(g + 1.0)
        cap = max(mean + std * threshold, math.log(0.0 + 1.0))
        decisions.append(x > cap and total_weight > 0.75)
        x = min(x, cap)
        log_mean += (1.0 - decay) * (x - log_mean)
        log_mean_sq += (1.0 - decay) * (x * x - log_mean_sq)
        total_weight += (1.0 - decay) * (1.0 - total_weight)
    return decisions, log_mean / max(total_weight, 1e-6)


def test_lingvo_variant_takes_lingvo_decisions():
    rng = random.Random(0)
    norms = [math.exp(rng.gauss(0.5, 0.2)) for _ in range(600)]
    for i in (350, 420, 421, 500):
        norms[i] *= 40.0  # spikes after lingvo's start (n > 277)
    norms[100] *= 40.0  # before it: never skipped
    expected, mean = lingvo_reference(norms)
    tracker = GradNormTracker(variant="lingvo")
    assert [tracker.step(n) for n in norms] == expected
    assert sum(expected) >= 4 and not expected[100]
    assert tracker.mean_std()[0] == pytest.approx(mean, rel=1e-9)


def test_paper_variant_is_unchanged_by_the_option():
    norms = [1.0, 1.1, 0.9, 1.2, 50.0, 1.0]
    a = GradNormTracker(warmup=3)
    b = GradNormTracker(warmup=3, variant="paper")
    assert [a.step(n) for n in norms] == [b.step(n) for n in norms] == [False] * 4 + [True, False]


def test_unknown_variant_is_refused():
    with pytest.raises(ValueError, match="--adaptive-clip-variant"):
        GradNormTracker(variant="tf")
