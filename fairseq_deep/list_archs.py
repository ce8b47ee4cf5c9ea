"""``fairseq-deep-list-archs [FAMILY]``: the architectures (``--arch``) of fairseq_deep by family,
one line each (``fairseq-deep-train --arch ARCH --help`` lists an architecture's options)."""

import collections
import difflib
import signal
import sys
from typing import Optional

from .errors import ArgumentParser, UserError, report_user_errors


def _one_line(doc: Optional[str], width: int = 100) -> str:
    text = " ".join((doc or "").strip().split("\n\n")[0].split())
    return text if len(text) <= width else text[: width - 3].rstrip() + "..."


def our_architectures():
    """``{family (model name): [(arch, one-line description), ...]}`` of the declared families
    (:mod:`fairseq_deep.models.families`), each family where its first preset was registered, its
    presets in registration order."""
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_NAME_REGISTRY

    from .models import families as declared

    order = list(ARCH_MODEL_NAME_REGISTRY)
    families = collections.OrderedDict()
    for family in sorted(
        (f for f in declared.registered() if f.presets()),
        key=lambda f: order.index(f.presets()[0]),
    ):
        for arch in family.presets():
            doc = ARCH_CONFIG_REGISTRY[arch].__doc__ if arch in ARCH_CONFIG_REGISTRY else None
            if not doc and arch == family.name:
                doc = "the family's defaults"
            families.setdefault(family.name, []).append((arch, _one_line(doc)))
    return families


def family_description(model_cls) -> str:
    """The first sentence of the model class's docstring, or of its module's."""
    return _one_line(model_cls.__doc__ or sys.modules[model_cls.__module__].__doc__)


def cli_main(argv=None):
    parser = ArgumentParser(
        prog="fairseq-deep-list-archs",
        description="List the architectures (--arch) of fairseq_deep by family, one line each. "
        "`fairseq-deep-train --arch ARCH --help` lists an architecture's options.",
    )
    parser.add_argument(
        "family",
        nargs="?",
        help="only this family (a model name, e.g. transformer_dlcl) "
        "or the architectures whose name contains this word",
    )
    args = parser.parse_args(argv)
    if hasattr(signal, "SIGPIPE"):  # `fairseq-deep-list-archs | head` ends quietly
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)

    def run():
        from .models import families as declared

        families = our_architectures()
        if args.family:
            chosen = {f: a for f, a in families.items() if f == args.family}
            if not chosen:
                chosen = {f: [x for x in a if args.family in x[0]] for f, a in families.items()}
                chosen = {f: a for f, a in chosen.items() if a}
            if not chosen:
                close = difflib.get_close_matches(args.family, list(families), n=3, cutoff=0.5)
                raise UserError(
                    f"no family or architecture matches {args.family!r}"
                    + (f"; did you mean {', '.join(close)}?" if close else ".")
                    + f" Families: {', '.join(families)}"
                )
            families = chosen
        width = max(len(a) for archs in families.values() for a, _ in archs)
        for family, archs in families.items():
            print(f"{family}: {family_description(declared.get(family).model)}")
            for arch, doc in archs:
                print(f"  {arch:<{width}}  {doc}")
            print()

    report_user_errors(run, "fairseq-deep-list-archs")


if __name__ == "__main__":
    cli_main()
