"""``inductor-debug minify``'s options: the failure signature and the constraints, from the command line.

    inductor-debug minify RUN_DIR                              # the constraints recorded in the run's manifest
    inductor-debug minify RUN_DIR --alignment 8 --deny-op aten.gelu.default
    inductor-debug minify graph.py --constraints constraints.json --signature constraint:dtype
    inductor-debug minify graph.py --signature exception:RuntimeError:unsupported --backend my_compiler.py:compile
    inductor-debug minify graph.py --signature accuracy --backend inductor --rtol 1e-4 --atol 1e-5

``--constraints`` takes a JSON file (or inline JSON) holding a list of constraint descriptions, the
form a run's ``manifest.json`` records under ``info.constraints`` (``{"name": "shape_alignment",
"alignment": 8}``, ``{"name": "dtype", "allowed_dtypes": [...]}`` ...). Imports torch only when run.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from debug_framework.cli.framework import CliError
from debug_framework.jsonio import JsonObject
from debug_framework.suggest import did_you_mean, one_of

if TYPE_CHECKING:
    from .constraints import Constraint
    from .minifier.signatures import Backend, Signature

__all__ = ["CONSTRAINT_KINDS", "SIGNATURE_KINDS", "VIOLATION_NAMES", "MinifyOptions", "build_constraints",
           "build_signature"]

#: Constraint kinds ``--constraints`` accepts (those a standalone repro can re-check).
CONSTRAINT_KINDS = ("dtype", "shape_alignment", "max_rank", "layout", "memory", "unsupported_op",
                    "op_not_in_allowlist")
#: Violation names a ``constraint:NAME`` signature can name (``memory`` reports two kinds).
VIOLATION_NAMES = ("dtype", "shape_alignment", "max_rank", "layout", "memory_per_tensor", "memory_peak",
                   "unsupported_op", "op_not_in_allowlist", "dynamic_shape")
SIGNATURE_KINDS = ("constraint", "exception", "accuracy")


class MinifyOptions:
    """What ``inductor-debug minify`` was given besides the path (all optional)."""

    def __init__(self, *, signature: str | None = None, backend: str | None = None, reference: str = "eager",
                 rtol: float = 1e-4, atol: float = 1e-5, constraints: str | None = None,
                 alignment: int | None = None, deny_ops: list[str] | None = None) -> None:
        self.signature, self.backend, self.reference = signature, backend, reference
        self.rtol, self.atol = rtol, atol
        self.constraints, self.alignment, self.deny_ops = constraints, alignment, list(deny_ops or [])

    @property
    def sets_constraints(self) -> bool:
        """True when the command line says which constraints to check with."""
        return self.constraints is not None or self.alignment is not None or bool(self.deny_ops)


def _constraint_configs(text: str) -> list[JsonObject]:
    """``--constraints``: inline JSON (starting with ``[``) or the path of a JSON file; checked."""
    source = "--constraints"
    if not text.lstrip().startswith("["):
        path = Path(text).expanduser()
        if not path.is_file():
            raise CliError(f"--constraints: no file {path}", hint="pass a JSON file or inline JSON: "
                           '[{"name": "shape_alignment", "alignment": 8}]', kind="environment")
        source, text = f"--constraints {path}", path.read_text(encoding="utf-8")
    try:
        configs = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(f"{source} is not JSON: {exc}") from exc
    if not isinstance(configs, list) or not all(isinstance(c, dict) for c in configs):
        raise CliError(f"{source} must be a JSON list of objects", hint='e.g. [{"name": "dtype", '
                       '"allowed_dtypes": ["float32", "float16"]}]')
    for c in configs:
        if c.get("name") not in CONSTRAINT_KINDS:
            raise CliError(f"{source}: unknown constraint {c.get('name')!r}" + did_you_mean(c.get("name"), CONSTRAINT_KINDS),
                           hint=one_of(CONSTRAINT_KINDS))
    return configs


def build_constraints(options: MinifyOptions, recorded: list[JsonObject] | None) -> list[Constraint] | None:
    """The constraints to minify with: ``--constraints`` (else the ``recorded`` ones of the run, else the
    mock accelerator's), with ``--alignment`` replacing any shape alignment and ``--deny-op`` added.
    ``None`` when nothing is given or recorded (the minifier's default)."""
    from .minifier.saved import constraints_from_config

    if options.constraints is not None:
        configs: list[JsonObject] | None = _constraint_configs(options.constraints)
    else:
        configs = recorded
    if not options.alignment and not options.deny_ops:
        return None if configs is None else _from_config(constraints_from_config, configs)
    from .config import MockConfig
    from .constraints import OpDenylistConstraint, ShapeConstraint

    cons = MockConfig().constraints() if configs is None else _from_config(constraints_from_config, configs)
    if options.alignment is not None:
        cons = [c for c in cons if not isinstance(c, ShapeConstraint)] + [ShapeConstraint(alignment=options.alignment)]
    if options.deny_ops:
        cons.append(OpDenylistConstraint(options.deny_ops))
    return cons


def _from_config(convert: Callable[[list[JsonObject]], list[Constraint]], configs: list[JsonObject]) -> list[Constraint]:
    try:
        return convert(configs)
    except (KeyError, TypeError, ValueError) as exc:
        raise CliError(f"a constraint description is incomplete or invalid: {type(exc).__name__}: {exc}",
                       hint="write them as a run's manifest.json records them (info.constraints)") from exc


def build_signature(options: MinifyOptions, constraints: list[Constraint] | None,
                    load_backend: Callable[[str], Backend]) -> Signature | None:
    """The ``--signature`` (``None``: found by re-checking the constraints). ``load_backend`` turns a
    ``module:attr``/``file.py:attr`` spec into the backend object."""
    if options.signature is None:
        if options.backend is not None:
            raise CliError("--backend needs --signature exception:TYPE[:PATTERN] or --signature accuracy")
        return None
    kind, _, rest = options.signature.partition(":")
    if kind not in SIGNATURE_KINDS:
        raise CliError(f"unknown signature kind {kind!r}" + did_you_mean(kind, SIGNATURE_KINDS),
                       hint="use constraint:NAME[:OP], exception:TYPE[:PATTERN] or accuracy")
    from .minifier.signatures import AccuracySignature, ConstraintSignature, ExceptionSignature

    if kind == "constraint":
        name, _, op = rest.partition(":")
        if name not in VIOLATION_NAMES:
            raise CliError(f"--signature constraint:{name}: unknown constraint" + did_you_mean(name, VIOLATION_NAMES),
                           hint=one_of(VIOLATION_NAMES))
        return ConstraintSignature(name, op or None, constraints=constraints)
    if options.backend is None:
        raise CliError(f"an {kind} signature needs --backend",
                       hint="--backend inductor (a torch.compile backend name), module:attr or file.py:attr")
    backend, spec = (load_backend(options.backend), options.backend) if ":" in options.backend else (options.backend, None)
    if kind == "exception":
        exc_type, _, pattern = rest.partition(":")
        if not exc_type:
            raise CliError("--signature exception needs the exception type", hint="e.g. exception:RuntimeError:pattern")
        return ExceptionSignature(exc_type, pattern, backend=backend, backend_spec=spec)
    if rest:
        raise CliError(f"--signature accuracy takes no argument (got {rest!r})", hint="use --rtol, --atol, --reference")
    if options.reference not in ("eager", "float64"):
        raise CliError(f"unknown --reference {options.reference!r}" + did_you_mean(options.reference, ("eager", "float64")),
                       hint="use eager or float64")
    return AccuracySignature(backend, reference=options.reference, rtol=options.rtol, atol=options.atol,
                             backend_spec=spec)
