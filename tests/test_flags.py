"""Renamed flags (issue 13, item 7): the new name and the deprecated old one set the same option."""

from fairseq import options
from helpers import parse_model_args


def test_ta_no_encoder_residual_and_its_old_name_set_the_same_option():
    assert parse_model_args("transformer_ta").encoder_no_residual is False
    new = vars(parse_model_args("transformer_ta", ["--ta-no-encoder-residual"]))
    old = vars(parse_model_args("transformer_ta", ["--encoder-no-residual"]))
    assert new == old and new["encoder_no_residual"] is True


def test_old_flag_name_is_marked_deprecated_in_help():
    parser = options.get_training_parser()
    options.parse_args_and_arch(
        parser, ["dummy-data", "--task", "translation", "--arch", "transformer_ta", "--cpu"]
    )
    helps = {s: a.help for a in parser._actions for s in a.option_strings}
    assert helps["--encoder-no-residual"] == "deprecated name of --ta-no-encoder-residual"
    assert "residual connections" in helps["--ta-no-encoder-residual"]


def test_deep_att_optimizer_flags_have_prefixed_names():
    def parse(*extra):
        parser = options.get_training_parser()
        return vars(
            options.parse_args_and_arch(
                parser,
                [
                    "dummy-data",
                    "--task",
                    "translation",
                    "--arch",
                    "deep_att_ff",
                    "--cpu",
                    "--optimizer",
                    "deep_att",
                    "--lr",
                    "1e-3",
                    *extra,
                ],
            )
        )

    assert parse("--deep-att-lr-recurrent", "2e-4", "--deep-att-update-rule", "sgd") == parse(
        "--lr-recurrent", "2e-4", "--update-rule", "sgd"
    )
    assert parse("--deep-att-lr-recurrent", "2e-4")["lr_recurrent"] == 2e-4
