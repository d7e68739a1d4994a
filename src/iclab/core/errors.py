"""One error shape for the whole library: owner, field, what is allowed, what was got.

ConfigError: LinearTransformerConfig.n_layers must be an int >= 1; got 0
"""

from __future__ import annotations

from typing import Any


class IclabError(ValueError):
    """Base class of every error iclab raises on bad input."""


class ConfigError(IclabError):
    """A configuration field or call argument has a value that is not allowed."""


class ShapeError(IclabError):
    """A tensor has the wrong shape, dtype or device."""


class CorruptFileError(IclabError):
    """A file on disk is damaged, torn, fails its checksum, or holds something iclab will not unpickle."""

    def __init__(self, path: object, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason


class OutputError(IclabError):
    """The output directory cannot be written (read-only, no permission, disk full)."""


class DivergenceError(IclabError, FloatingPointError):
    """Training produced a non-finite loss or parameter; the message names the step, the parameter and the last finite
    loss, and the last good checkpoint is kept. ``step``: the step it happened at (None where not known)."""

    def __init__(self, message: str, step: int | None = None) -> None:
        super().__init__(message)
        self.step = step

    def __reduce__(self) -> tuple[Any, ...]:  # the step survives a trip to a worker and back
        return type(self), (str(self), self.step)


def _owner_name(owner: Any) -> str:
    if isinstance(owner, str):
        return owner
    return type(owner).__name__


def require(owner: Any, field: str, ok: bool, allowed: str, got: Any = None) -> None:
    """Raise ``ConfigError`` naming ``owner.field``, what is allowed and what was got, unless ``ok``.

    ``got`` defaults to ``getattr(owner, field)`` when ``owner`` is an object.
    """
    if ok:
        return
    if got is None and not isinstance(owner, str):
        got = getattr(owner, field, None)
    raise ConfigError(f"{_owner_name(owner)}.{field} must be {allowed}; got {got!r}")


def is_int(value: Any, low: int) -> bool:
    """``value`` is an int (not a bool) >= ``low``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def require_int(owner: Any, field: str, value: Any, low: int = 1, note: str = "") -> None:
    """Raise ``ConfigError`` naming ``owner.field`` unless ``value`` is an int (not a bool) >= ``low``."""
    require(owner, field, is_int(value, low), f"an int >= {low}" + (f" ({note})" if note else ""), value)


def require_shape(owner: str, field: str, shape: tuple[int, ...], expected: tuple[Any, ...], note: str = "") -> None:
    """Raise ``ShapeError`` unless ``shape`` matches ``expected`` (``None`` entries match anything)."""
    if len(shape) == len(expected) and all(e is None or e == s for s, e in zip(shape, expected, strict=True)):
        return
    want = "(" + ", ".join("?" if e is None else str(e) for e in expected) + ("," if len(expected) == 1 else "") + ")"
    raise ShapeError(f"{owner}.{field} must have shape {want}{note}; got {tuple(shape)}")


def did_you_mean(name: str, choices: list[str] | tuple[str, ...] | set[str]) -> str:
    """A ``; did you mean 'x'?`` suffix for unknown names, or the list of choices."""
    import difflib

    close = difflib.get_close_matches(name, sorted(choices), n=1)
    if close:
        return f"; did you mean {close[0]!r}?"
    return f"; choose from {sorted(choices)}"
