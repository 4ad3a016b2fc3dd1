"""The root ``somnus`` typer app that every command module adds its commands to (``somnus/cli/__init__.py``),
and typer's parameter coercion without pydantic for the parameter types Somnus uses."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, get_args, get_origin

import typer

app = typer.Typer(
    help="Somnus: memory for fleets of AI agents (Kafka -> Faust -> DuckDB).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

_TRUE = {"1", "true", "t", "yes", "y", "on"}
_FALSE = {"0", "false", "f", "no", "n", "off", ""}


def light_coercion() -> bool:
    """Coerce ``str``, ``bool``, ``int``, ``float`` and ``Path`` parameters (and lists of them) without
    pydantic; True when applied.

    typer 0.2x builds a pydantic ``TypeAdapter`` for each parameter of the command being run
    (``typer._coercion.build_runtime_param``): importing pydantic and building those schemas was most
    of a read command's start (``somnus bench cli``: ~0.2 s of a ~0.35 s ``somnus sql``). This does
    what those adapters do for the plain types (typer's own path checks included) and hands any other
    annotation, or one with ``min``/``max``/``clamp``/``parser``, to typer's. It relies on
    ``typer.core.build_runtime_param`` and ``typer._coercion.RuntimeParam``; ``tests/somnus/cli/
    test_app.py`` fails when they are gone (then delete this, or follow typer). Without typer's
    adapters (an older typer), nothing is changed."""
    try:
        from typer import _coercion, _param_types, core
    except ImportError:
        return False
    original = getattr(core, "build_runtime_param", None)
    base = getattr(_coercion, "RuntimeParam", None)
    if original is None or base is None or getattr(original, "somnus_light", False):
        return bool(original is not None and getattr(original, "somnus_light", False))
    bad = _coercion.BadParameter

    def leaf(annotation: Any, info: Any) -> Any:
        """The coercion of one plain value, or None when typer's adapters should do it."""
        if info.parser is not None or info.min is not None or info.max is not None or info.clamp:
            return None
        if annotation is str:
            return lambda v, param, ctx: v.decode() if isinstance(v, bytes) else str(v)
        if annotation is bool:

            def as_bool(v: Any, param: Any, ctx: Any) -> bool:
                if isinstance(v, bool):
                    return v
                if str(v).strip().lower() in _TRUE | _FALSE:
                    return str(v).strip().lower() in _TRUE
                raise bad(f"{v!r} is not a valid boolean.", ctx=ctx, param=param)

            return as_bool
        if annotation in (int, float):

            def as_number(v: Any, param: Any, ctx: Any) -> Any:
                try:
                    return annotation(v)
                except (TypeError, ValueError):
                    raise bad(f"{v!r} is not a valid {annotation.__name__}.", ctx=ctx, param=param) from None

            return as_number
        if annotation is Path and info.path_type is None:
            return lambda v, param, ctx: _param_types.coerce_cli_path(
                v if isinstance(v, Path) else Path(os.fsdecode(v)), info, path_type=Path, param=param, ctx=ctx
            )
        return None

    class Light(base):  # type: ignore[misc, valid-type]
        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            many = get_origin(self.annotation) is list
            one = leaf(get_args(self.annotation)[0] if many else self.annotation, self.parameter_info)
            if many:
                return [one(v, param, ctx) for v in (value if isinstance(value, (list, tuple)) else [value])]
            return one(value, param, ctx)

    def build(descriptor: Any) -> Any:
        annotation = descriptor.annotation
        inner = (
            get_args(annotation)[0] if get_origin(annotation) is list and len(get_args(annotation)) == 1 else annotation
        )
        if descriptor.file_annotation is None and leaf(inner, descriptor.parameter_info) is not None:
            return Light(parameter_info=descriptor.parameter_info, annotation=annotation)
        return original(descriptor)

    build.somnus_light = True  # type: ignore[attr-defined]
    core.build_runtime_param = build
    return True


LIGHT_COERCION = light_coercion()
