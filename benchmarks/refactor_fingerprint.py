"""Fingerprint of the package's numbers, to show that a refactor changes none of them.

    python -m benchmarks.refactor_fingerprint OUT.json              # this checkout
    python -m benchmarks.refactor_fingerprint --compare A.json B.json

Writes, for every ``--arch`` of the package, the namespace its preset fills from four starting
namespaces (empty, a --dropout, the embedding widths, a --hybrid-decoder), and, for tiny models of
every family (the tests' sizes, seed 1), the sum of the training-mode logits on a fixed batch, the
sum of |gradient| over all parameters, and the parameter count.  ``--compare`` lists what differs
(exit status 1 if anything does).  To fingerprint older code, run the script from an export of that
commit with the package imported from there, e.g.

    git archive COMMIT fairseq_deep | tar -x -C /tmp/old
    python -m benchmarks.refactor_fingerprint --package-dir /tmp/old OLD.json

CPU, one thread, about a minute.
"""

if __name__ == "__main__" and not __package__:  # run as a file, the package's imports would fail
    raise SystemExit(
        "benchmarks/refactor_fingerprint.py is a module of the benchmarks package: run it from the "
        "repository root as python -m benchmarks.refactor_fingerprint"
    )

import argparse
import importlib.util
import json
import os
import sys

from . import harness
from .harness import add_device_argument, device_from_args


def _use_package_dir(path: str):
    """Import fairseq_deep from ``path`` (its ``fairseq_deep/`` folder) instead of the checkout's or
    the installed (editable) copy: the package is loaded from there under its own name, so that
    every later import of it and of its modules finds that copy."""
    sys.meta_path[:] = [
        f
        for f in sys.meta_path
        if "editable" not in type(f).__module__.lower() and "Editable" not in type(f).__name__
    ]
    folder = os.path.join(os.path.abspath(path), "fairseq_deep")
    spec = importlib.util.spec_from_file_location(
        "fairseq_deep", os.path.join(folder, "__init__.py"), submodule_search_locations=[folder]
    )
    package = importlib.util.module_from_spec(spec)
    sys.modules["fairseq_deep"] = package
    spec.loader.exec_module(package)


def presets():
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

    ours = sorted(
        a for a, m in ARCH_MODEL_REGISTRY.items() if m.__module__.startswith("fairseq_deep")
    )
    starts = [
        {},
        {"dropout": 0.1},
        {"decoder_embed_dim": 512, "encoder_embed_dim": 512},
        {"hybrid_decoder": "transformer"},
    ]
    out = {}
    for arch in ours:
        for i, start in enumerate(starts):
            ns = argparse.Namespace(**start)
            try:
                ARCH_CONFIG_REGISTRY[arch](ns)
                out[f"{arch}/{i}"] = {k: repr(v) for k, v in sorted(vars(ns).items())}
            except (
                Exception
            ) as e:  # a preset refusing a start (a fixed option) is part of the print
                out[f"{arch}/{i}"] = f"{type(e).__name__}: {e}"
    return out


def cases():
    """The models fingerprinted: (--arch, flags) of tiny models of every family, at the tests'
    sizes written out in the harness (not read from the package: they must be the same for both
    versions compared).  Kept by hand, as the print of an older version must have the same rows;
    tests/test_families.py fails when a declared family has none."""
    TINY, TINY_RNMT = harness.TINY, harness.TINY_RNMT

    hybrid = TINY + [
        "--encoder-hidden-size",
        "16",
        "--decoder-hidden-size",
        "16",
        "--rnmt-encoder-layers",
        "2",
        "--encoder-layers",
        "2",
        "--decoder-layers",
        "2",
    ]
    cases = [
        ("transformer_dlcl", []),
        ("transformer_postnorm", []),
        ("transformer_ta", []),
        ("transformer_ta_nores", []),
        ("transformer_hier_agg", []),
        ("transformer_mla2", []),
        ("rnmt_plus", []),
        ("rnmt_plus", ["--dlcl-stacks", "both"]),
        ("rnmt_plus_512_ta", TINY_RNMT),
        ("rnmt_plus", ["--rnmt-transparent"]),
        ("deep_att", []),
        ("deep_ed_ff", []),
        ("deep_att_noff_2x2", []),
        ("transformer_admin", []),
        ("transformer_deepnorm", []),
        ("transformer_rezero", []),
        ("transformer_postnorm", ["--ds-init"]),
    ]
    cases += [
        (h, hybrid)
        for h in (
            "hybrid_transformer_rnmt",
            "hybrid_rnmt_transformer",
            "hybrid_cascaded",
            "hybrid_multicolumn",
        )
    ]
    cases.append(
        (
            "hybrid_multicolumn",
            hybrid + ["--hybrid-columns", "rnmt,transformer,rnmt", "--hybrid-rnmt-dropout", "0.2"],
        )
    )
    return cases


def models(device):
    import torch

    build_model, random_batch = harness.tiny_model, harness.random_batch
    out = {}
    for arch, extra in cases():
        model, task = build_model(arch, extra)
        model.to(device)
        src, lengths, prev = (t.to(device) for t in random_batch(task.source_dictionary))
        model.train()
        torch.manual_seed(3)
        y = model(src, lengths, prev)[0]
        y.float().pow(2).sum().backward()
        grad = sum(p.grad.double().abs().sum() for p in model.parameters() if p.grad is not None)
        out[f"{arch} {' '.join(extra)}".strip()] = [
            y.double().sum().item(),
            grad.item(),
            sum(p.numel() for p in model.parameters()),
        ]
    return out


def get_parser():
    parser = harness.parser(__doc__)
    parser.add_argument("out", nargs="?", help="where to write the fingerprint (JSON)")
    parser.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two fingerprints")
    parser.add_argument("--package-dir", help="import fairseq_deep from this directory")
    add_device_argument(parser, note="compare fingerprints taken on the same device")
    return parser


def main(argv=None):
    parser = get_parser()
    args = parser.parse_args(argv)
    device = device_from_args(args)
    if args.compare:
        a, b = (json.load(open(p)) for p in args.compare)
        differ = [
            f"{part} {key}"
            for part in ("presets", "models")
            for key in sorted(set(a[part]) | set(b[part]))
            if a[part].get(key) != b[part].get(key)
        ]
        print(
            "\n".join(differ)
            if differ
            else f"identical: {len(a['presets'])} preset namespaces, {len(a['models'])} models"
        )
        sys.exit(1 if differ else 0)
    if not args.out:
        parser.error("give OUT.json, or --compare A B")
    if args.package_dir:
        _use_package_dir(args.package_dir)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    import fairseq_deep  # noqa: F401  (registers the architectures)

    print(f"fairseq_deep from {os.path.dirname(fairseq_deep.__file__)}", file=sys.stderr)
    harness.write_json(args.out, {"presets": presets(), "models": models(device)}, sort_keys=True)


if __name__ == "__main__":
    main()
