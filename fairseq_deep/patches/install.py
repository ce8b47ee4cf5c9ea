"""How a patch takes the place of a fairseq function: once, keeping the function it replaced.

Every patch installed when the package is imported is a function (``shim``) that stands in for one
named fairseq (or torch, fairscale) function and calls it: :func:`install` puts it in place and
remembers the original, which the shim reaches with :func:`fairseq_original`.  Installing is
idempotent (importing the plugin twice, or ``--user-dir`` after a ``fairseq-deep-*`` script
imported it, changes nothing): a function already marked ``_fairseq_deep`` is left as it is.
The console scripts' own patches (:mod:`fairseq_deep.patches.scripts`) wrap fairseq functions in
closures with the same mark.
"""

_ORIGINAL = {}  # each shim -> the fairseq function it stands in for


def fairseq_original(shim):
    """The fairseq function that ``shim`` replaced (and calls)."""
    return _ORIGINAL[shim]


def install(owner, name, shim, as_classmethod=False):
    """Put ``shim`` in place of ``owner.name``, once (importing the plugin twice changes nothing)."""
    current = getattr(owner, name)
    if getattr(current, "_fairseq_deep", False):
        return
    _ORIGINAL[shim] = current.__func__ if as_classmethod else current
    shim._fairseq_deep = True
    setattr(owner, name, classmethod(shim) if as_classmethod else shim)
