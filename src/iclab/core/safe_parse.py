"""Bounded YAML and JSON readers: every config, override, sweep spec and run-directory file is parsed here.

A document that is too large, nested too deeply, repeats a key, or (YAML) uses an anchor or alias is refused with
one :class:`DocumentError` line naming it, before it can cost memory or time: a 0.5 kB YAML alias bomb ("billion
laughs") expands to gigabytes in ``yaml.safe_load``, and JSON nested 200 000 deep raises ``RecursionError`` in
``json.loads``. Nothing here executes anything: YAML is read by :class:`YamlLoader`, a ``yaml.SafeLoader`` with
YAML 1.2 floats.

    load_yaml_text("train: {lr: 1e-3}", what="override")      # {'train': {'lr': 0.001}}
    load_json_file(Path("runs/x/summary.json"))                # a DocumentError names the file and the bound

:class:`DocumentError` is a :class:`~iclab.core.errors.ConfigError` and a ``yaml.YAMLError``, so existing handlers of
either keep catching it.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any, TypeGuard

import yaml
import yaml.events
import yaml.nodes

from iclab.core.errors import ConfigError

#: The largest YAML document read (bytes): configs and sweep specs are a few kB; parsing is pure Python (~1 MB/s).
MAX_YAML_BYTES = 1 << 20
#: The largest JSON document read (bytes): run directories' summaries and claims are a few kB, tables a few MB.
MAX_JSON_BYTES = 64 << 20
#: The deepest nesting of lists and mappings accepted in either format.
MAX_DEPTH = 64


class DocumentError(ConfigError, yaml.YAMLError):
    """A YAML or JSON document that is malformed or exceeds a bound (size, nesting, anchors, duplicate keys)."""


class YamlLoader(yaml.SafeLoader):
    """PyYAML's safe loader reading floats as YAML 1.2 does (``1e-3`` and ``2E5`` are numbers, not strings as in YAML
    1.1, so ``train.lr=1e-3`` means what a researcher typed), with bounds: nesting at most :data:`MAX_DEPTH`, no
    anchors or aliases (the alias bomb), no repeated key in a mapping."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.events.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise DocumentError(
                f"YAML anchors and aliases (&name, *name) are not accepted{_where(event)}: write the value out"
            )
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise DocumentError(f"YAML nested deeper than {MAX_DEPTH} levels{_where(event)}")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.nodes.MappingNode):
            seen: set[Any] = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    dup = key in seen
                    seen.add(key)
                except TypeError:  # an unhashable key: the base class refuses it with its own message
                    continue
                if dup:
                    raise DocumentError(f"duplicate key {key!r}{_where(key_node)}")
        return super().construct_mapping(node, deep=deep)


YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def _where(mark_holder: Any) -> str:
    mark = getattr(mark_holder, "start_mark", None)
    return f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""


def load_yaml_text(text: str, *, what: str = "YAML", max_bytes: int = MAX_YAML_BYTES) -> Any:
    """Parse one YAML document with the bounds of this module; ``what`` names it in the error."""
    if len(text) > max_bytes:  # characters: a cheap upper-bound check before encoding
        raise DocumentError(f"{what} is {len(text)} characters; at most {max_bytes} are read")
    try:
        return yaml.load(text, Loader=YamlLoader)
    except DocumentError as e:
        raise DocumentError(f"{what}: {e}") from None
    except RecursionError:
        raise DocumentError(f"{what}: nested too deeply") from None


def load_json_text(text: str | bytes, *, what: str = "JSON", max_bytes: int = MAX_JSON_BYTES) -> Any:
    """Parse one JSON document: at most ``max_bytes``, nesting at most :data:`MAX_DEPTH`, no repeated key
    (``NaN`` and ``Infinity``, which Python's ``json`` writes, are accepted)."""
    if len(text) > max_bytes:
        raise DocumentError(f"{what} is {len(text)} bytes; at most {max_bytes} are read")
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DocumentError(f"{what} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    try:
        value = json.loads(text, object_pairs_hook=_unique_pairs)
    except json.JSONDecodeError as e:
        raise DocumentError(f"{what} is not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    except RecursionError:  # the C decoder stops at the interpreter's recursion limit, cleanly
        raise DocumentError(f"{what}: nested deeper than {MAX_DEPTH} levels") from None
    except DocumentError as e:
        raise DocumentError(f"{what}: {e}") from None
    if _depth(value) > MAX_DEPTH:
        raise DocumentError(f"{what}: nested deeper than {MAX_DEPTH} levels")
    return value


def _depth(value: Any) -> int:
    """The nesting depth of parsed lists and mappings (iterative: no recursion on hostile input)."""
    best, stack = 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        best = max(best, level)
        if best > MAX_DEPTH:
            return best
        stack.extend((c, level + 1) for c in children if isinstance(c, dict | list))
    return best


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise DocumentError(f"duplicate key {k!r}")
        out[k] = v
    return out


def read_bounded(path: str | Path, max_bytes: int, *, what: str | None = None) -> bytes:
    """A file's bytes, refusing one larger than ``max_bytes`` before reading it (``OSError`` passes through)."""
    path = Path(path)
    what = what or str(path)
    with path.open("rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > max_bytes:
            raise DocumentError(f"{what} is {size} bytes; at most {max_bytes} are read")
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:  # grew while open, or a device with no size
        raise DocumentError(f"{what} is over {max_bytes} bytes; at most {max_bytes} are read")
    return data


def load_yaml_file(path: str | Path, *, max_bytes: int = MAX_YAML_BYTES, what: str | None = None) -> Any:
    """Parse a YAML file with the bounds of this module; ``what`` names it in errors (default: the path).
    ``OSError`` passes through."""
    what = what or str(path)
    data = read_bounded(path, max_bytes, what=what)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DocumentError(f"{what} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    return load_yaml_text(text, what=what, max_bytes=max_bytes)


def load_json_file(path: str | Path, *, max_bytes: int = MAX_JSON_BYTES, what: str | None = None) -> Any:
    """Parse a JSON file with the bounds of this module; ``what`` names it in errors (default: the path).
    ``OSError`` passes through."""
    what = what or str(path)
    return load_json_text(read_bounded(path, max_bytes, what=what), what=what, max_bytes=max_bytes)


def is_finite_number(value: Any) -> TypeGuard[int | float]:
    """An int or float (not a bool) that is finite: what a stored time, loss or count must be."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
