"""Minifier: reduce a failing FX graph to a minimal one with the *same* failure, and write a verified,
standalone repro directory.

    from debug_module.minifier import Minifier, AccuracySignature
    result = Minifier(gm, example_inputs, AccuracySignature(my_backend, rtol=1e-3)).minify()
    print(result.summary(), result.repro_path)

See docs/minifier.md.
"""

from __future__ import annotations

from .codegen import VerifyResult, verify_repro, write_repro_dir
from .minifier import Minifier, MinifyResult
from .saved import load_repro_dir, minify_saved_graph
from .signatures import AccuracySignature, BackendRef, ConstraintSignature, ExceptionSignature, Signature, signature_from_dict
from .strict import write_strict_repro

__all__ = [
    "Minifier",
    "MinifyResult",
    "Signature",
    "ConstraintSignature",
    "ExceptionSignature",
    "AccuracySignature",
    "BackendRef",
    "signature_from_dict",
    "write_repro_dir",
    "verify_repro",
    "VerifyResult",
    "minify_saved_graph",
    "load_repro_dir",
    "write_strict_repro",
]
