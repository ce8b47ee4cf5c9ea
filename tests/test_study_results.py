"""fairseq-deep-study's results: fairseq-generate's output in input order, sacreBLEU and the
paired bootstrap, the learning curve and what stopped training read from fairseq-train's log, the
markdown table, and the papers' claims judged (tests/test_study.py: the systems, groups, commands
and one end-to-end run)."""

import pytest

from fairseq_deep import runs, study

GENERATE_OUTPUT = """S-2\tc d
T-2\tref two
H-2\t-0.5\thyp two
D-2\t-0.5\tHyp two
P-2\t-0.1 -0.2
S-0\ta b
T-0\tref zero
H-0\t-0.1\thyp zero
D-0\t-0.1\tHyp zero
S-1\tb c
T-1\tref one
H-1\t-0.3\thyp one
D-1\t-0.3\tHyp one
Generate test with beam=5: BLEU4 = 1.00
"""


def test_generate_output_is_put_back_in_input_order():
    hyps, refs = study.parse_generate(GENERATE_OUTPUT, 3)
    assert hyps == ["Hyp zero", "Hyp one", "Hyp two"]  # D- (detokenized) lines, by id
    assert refs == ["ref zero", "ref one", "ref two"]
    h_only = "\n".join(line for line in GENERATE_OUTPUT.splitlines() if not line.startswith("D-"))
    assert study.parse_generate(h_only, 3)[0] == ["hyp zero", "hyp one", "hyp two"]
    with pytest.raises(ValueError, match="2 hypotheses for a test set of 3"):
        study.parse_generate(GENERATE_OUTPUT.replace("D-1\t", "X-1\t").replace("H-1\t", "X-1\t"), 3)
    with pytest.raises(ValueError, match="unexpected ids"):
        study.parse_generate(GENERATE_OUTPUT, 2)


def test_scores_and_paired_bootstrap():
    refs = [f"the cat sat on mat number {i}" for i in range(20)]
    good = list(refs)
    bad = [r.replace("cat", "dog").replace("mat", "rug") for r in refs]
    assert study.score(good, refs)["bleu"] == pytest.approx(100.0)
    assert study.score(bad, refs)["bleu"] < 50
    p = study.paired_bootstrap(bad, {"good": good}, refs, n_samples=100)
    assert set(p["good"]) == {"bleu_p", "chrf_p"} and p["good"]["bleu_p"] < 0.05


def test_markdown_table_shows_means_p_values_and_failures():
    results = {
        "settings": {
            "data": "D",
            "test_size": 3,
            "width": 16,
            "max_update": 5,
            "minutes": 0,
            "seeds": 2,
            "lr": 1e-3,
            "warmup": 2,
            "max_tokens": 100,
            "beam": 2,
            "checkpoint": "best",
        },
        "groups": {
            "wang": {
                "baseline": "postnorm_6",
                "systems": {
                    "postnorm_6": {
                        "arch": "transformer_postnorm",
                        "flags": [],
                        "depth": 6,
                        "seeds_done": 2,
                        "bleu_mean": 20.0,
                        "bleu_std": 1.0,
                        "chrf_mean": 40.0,
                        "chrf_std": 2.0,
                        "seeds": {
                            "1": {"bleu": 19.0, "updates": 5, "best_valid_loss": 3.0},
                            "2": {"bleu": 21.0, "updates": 5, "best_valid_loss": 3.5},
                        },
                    },
                    "dlcl_20": {
                        "arch": "transformer_dlcl_20l",
                        "flags": [],
                        "depth": 20,
                        "seeds_done": 1,
                        "bleu_mean": 25.0,
                        "bleu_std": 0.0,
                        "chrf_mean": 45.0,
                        "chrf_std": 0.0,
                        "paired_bs": {"1": {"bleu_p": 0.001, "chrf_p": 0.002}},
                        "seeds": {
                            "1": {"bleu": 25.0, "updates": 5, "best_valid_loss": 2.0},
                            "2": {"status": "failed", "error": "fairseq-train: RuntimeError: boom"},
                        },
                    },
                },
            }
        },
    }
    results["groups"]["wang"]["systems"]["postnorm_6"]["seeds"]["1"]["updates_per_second"] = 2.5
    results["groups"]["wang"]["systems"]["postnorm_6"]["seeds"]["2"]["updates_per_second"] = 2.25
    results["groups"]["wang"]["systems"]["postnorm_6"]["recipe"] = "Adam (0.9, 0.98)"
    results["groups"]["wang"]["systems"]["postnorm_6"]["precision"] = "fp16"
    results["groups"]["wang"]["systems"]["postnorm_6"]["seeds"]["1"].update(
        epochs=3, stopped="plateau"
    )
    results["groups"]["wang"]["systems"]["postnorm_6"]["seeds"]["2"].update(
        epochs=4, stopped="time"
    )
    md = study.markdown(results)
    assert (
        "| postnorm_6 | `transformer_postnorm` |  | 6 | 20.00 ± 1.00 | 40.00 ± 2.00 | baseline | 5/5 | 3 (plateau)/4 "
        "(time) | 2.5/2.25 | 3.000/3.500 | Adam (0.9, 0.98) | fp16 |" in md
    )
    assert (
        "| dlcl_20 | `transformer_dlcl_20l` |  | 20 | 25.00 | 45.00 | 0.0010 | 5 | - | - | 2.000 | - | - | seed 2: "
        "failed fairseq-train: RuntimeError: boom |" in md
    )


TRAIN_LOG = """\
2026-01-01 | INFO | train_inner | {"epoch": 1, "loss": "9.1", "num_updates": "10", "wall": "20"}
2026-01-01 | INFO | train_inner | {"epoch": 1, "loss": "8.1", "num_updates": "20", "wall": "40"}
2026-01-01 | INFO | valid | {"epoch": 1, "valid_loss": "8.5", "valid_num_updates": "20"}
2026-01-01 | INFO | train_inner | {"epoch": 1, "loss": "7.1", "num_updates": "30", "wall": "70"}
2026-01-01 | INFO | valid | {"epoch": 1, "valid_loss": "7.5", "valid_num_updates": "25"}
2026-01-01 | INFO | valid | {"epoch": 1, "valid_loss": "7.0", "valid_num_updates": "36"}
"""


def test_learning_curve_reads_updates_seconds_and_rate():
    from fairseq_deep.diagnostics.plot_training import parse_log_lines

    curve, ups = study.learning_curve(parse_log_lines(TRAIN_LOG.splitlines()))
    # at a record, between two (interpolated), and after the last (at the last rate, 30/70 per s)
    assert curve == [[20, 40.0, 8.5], [25, 55.0, 7.5], [36, 84.0, 7.0]]
    assert ups == pytest.approx(30 / 70, abs=1e-4)
    assert study.learning_curve({"valid_loss": [(5, 9.0)]}) == ([[5, None, 9.0]], None)


def test_learning_curve_times_from_the_validations():
    """A run that validates within its first second (a GPU, a fast CPU): fairseq's whole-second
    ``wall`` of the training records is 0, the validations' own clock (0.01 s) times them."""
    fast = {
        "wall": [(1.0, 0.0), (2.0, 0.0), (3.0, 0.0)],
        "valid_loss": [(2.0, 9.0), (4.0, 8.0)],
        "valid_wall": [(2.0, 0.31), (4.0, 0.62)],
    }
    curve, ups = study.learning_curve(fast)
    assert curve == [[2.0, 0.31, 9.0], [4.0, 0.62, 8.0]]
    assert ups == pytest.approx(4 / 0.62, abs=1e-4)
    # a validation's own time wins over the interpolation of the training records
    slow = {"wall": [(10.0, 20.0)], "valid_loss": [(10.0, 7.0)], "valid_wall": [(10.0, 20.4)]}
    assert study.learning_curve(slow)[0] == [[10.0, 20.4, 7.0]]


def test_a_log_says_what_stopped_training_and_the_epochs_it_completed():
    log = [
        '2026-01-01 10:00:00 | INFO | train | {"epoch": 1, "train_loss": "9.1", "train_num_updates": "10"}',
        '2026-01-01 10:00:01 | INFO | valid | {"epoch": 2, "valid_loss": "8.5", "valid_num_updates": "15"}',
        "2026-01-01 10:00:01 | INFO | fairseq_cli.train | early stop since valid performance hasn't "
        "improved for last 3 runs",
    ]
    records = runs.parse_log_lines(log)
    assert runs.epochs_done(records) == 1 and runs.stop_reason("\n".join(log)) == "plateau"
    resumed = "\n".join(log) + "\nStopping training due to cumulative_training_time: 0.1 > stop"
    assert runs.stop_reason(resumed) == "time" and runs.stop_reason("killed") is None


def test_a_claim_is_judged_by_the_sign_and_the_paired_bootstrap():
    """claims.judge: 'above' needs a higher BLEU and, with a paired test, p < ALPHA; 'not_below'
    fails only for a significantly lower score; 'below' holds for a diverged run; a comparison
    without a score is 'not yet run'.  Every claim names a system of its group."""
    from fairseq_deep.study import claims

    above = claims.Claim("g", "s", "above", "P")
    assert claims.judge(above, {"bleu": 31.0}, {"bleu": 30.0}, 0.01)[0] == "holds"
    assert claims.judge(above, {"bleu": 31.0}, {"bleu": 30.0}, 0.2)[0] == "does not hold"
    assert claims.judge(above, {"bleu": 29.0}, {"bleu": 30.0}, 0.01)[0] == "does not hold"
    flat = claims.Claim("g", "s", "not_below", "P")
    assert claims.judge(flat, {"bleu": 29.5}, {"bleu": 30.0}, 0.3)[0] == "holds"
    assert claims.judge(flat, {"bleu": 28.0}, {"bleu": 30.0}, 0.01)[0] == "does not hold"
    below = claims.Claim("g", "s", "below", "P")
    diverged = {"error": "FloatingPointError: Minimum loss scale reached (0.0001)."}
    assert claims.judge(below, diverged, {"bleu": 30.0}, None) == ("holds", "training diverged")
    assert claims.judge(below, {"error": "killed"}, {"bleu": 30.0}, None)[0] == "not yet run"
    assert claims.judge(above, {"bleu": 31.0}, {"error": "x"}, None)[0] == "not yet run"
    for c in claims.CLAIMS:
        _, systems = study.expand_group(c.group)
        names = {s.name for s in systems}
        assert c.system in names and (c.than is None or c.than in names), c
