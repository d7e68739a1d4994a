"""Typed configs: dataclasses built from dicts/YAML with dotted overrides, checked before any work.

    cfg = from_dict(TrainConfig, {"lr": 0.01}, owner="train")
    data = apply_overrides(yaml_dict, ["train.lr=0.02", "model.n_layers=4"])

An unknown key fails with a suggestion (``unknown key 'model.n_layer'; did you mean 'n_layers'?``);
a value of the wrong type names the field, the type wanted and the value got.

Configs nest: a field typed as a dataclass (``train: TrainConfig``) takes a mapping, merged onto that
field's default, so ``{"train": {"lr": 0.1}}`` changes the learning rate and keeps the rest of the
default ``TrainConfig``. Every error names the full path from the outermost owner
(``ahn2023.fig1.train.lr must be a float > 0; got -1``). :func:`route_shorthand` lets ``lr=0.1`` stand for
``train.lr=0.1`` when exactly one nested config has a field of that name.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, cast, get_args, get_origin

import yaml

from iclab.core.errors import ConfigError, did_you_mean
from iclab.core.safe_parse import DocumentError, load_yaml_file, load_yaml_text

T = TypeVar("T")


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """``typing.get_type_hints`` of a config class, once per class (it evaluates every annotation string)."""
    return typing.get_type_hints(cls)


def _fields(cls: type) -> dict[str, dataclasses.Field[Any]]:
    return {f.name: f for f in dataclasses.fields(cls) if f.init and not f.name.startswith("_")}


def _coerce(owner: str, name: str, tp: Any, value: Any) -> Any:
    """Check ``value`` against the annotation ``tp`` (coercing ints to floats, lists to tuples)."""
    origin = get_origin(tp)
    where = f"{owner}.{name}"
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(owner, name, a, value)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"{where} must be {_describe(tp)}; got {value!r}")
    if origin is Literal:
        if value not in get_args(tp):
            raise ConfigError(f"{where} must be one of {list(get_args(tp))}; got {value!r}")
        return value
    if origin in (tuple, list):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where} must be {_describe(tp)}; got {value!r}")
        args = get_args(tp)
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(args) != len(value):
                raise ConfigError(f"{where} must be {_describe(tp)} ({len(args)} entries); got {value!r}")
            return tuple(_coerce(owner, f"{name}[{i}]", a, v) for i, (a, v) in enumerate(zip(args, value, strict=True)))
        inner = args[0] if args else Any
        out = [_coerce(owner, f"{name}[{i}]", inner, v) for i, v in enumerate(value)]
        return tuple(out) if origin is tuple else out
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a mapping; got {value!r}")
        return dict(value)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        return from_dict(tp, value, owner=where)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where} must be a float; got {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where} must be an int; got {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false; got {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where} must be a string; got {value!r}")
        return value
    return value


def _describe(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return f"one of {list(get_args(tp))}"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in get_args(tp))
    if tp is type(None):
        return "null"
    if origin is tuple:
        return "a list of " + ", ".join(_describe(a) for a in get_args(tp) if a is not Ellipsis)
    return f"a {getattr(tp, '__name__', str(tp))}"


def from_dict(cls: type[T], data: dict[str, Any] | None, *, owner: str | None = None) -> T:
    """Build the dataclass ``cls`` from ``data``, rejecting unknown keys and badly typed values."""
    owner = owner or cls.__name__
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"{owner} must be a mapping; got {data!r}")
    data = dict(data or {})
    fields = _fields(cls)
    hints = _hints(cast(type, cls))  # mypy does not see a type[T] as Hashable (functools.cache's argument)
    for key in data:
        if key not in fields:
            names = set(fields) | _nested_names(cls)
            raise ConfigError(f"unknown key '{owner}.{key}'{did_you_mean(key, sorted(names))}")
        tp = hints[key]
        if dataclasses.is_dataclass(tp) and isinstance(data[key], dict):
            default = _default(fields[key])
            if dataclasses.is_dataclass(default) and not isinstance(default, type):
                data[key] = _deep_merge(to_dict(default), data[key])
    kwargs = {k: _coerce(owner, k, hints[k], v) for k, v in data.items()}
    try:
        return cls(**kwargs)
    except ConfigError as e:
        msg = str(e)
        if owner == cls.__name__ or msg.startswith(f"{owner}.") or msg.startswith(f"{owner}:"):
            raise
        if msg.startswith(f"{cls.__name__}."):  # TrainConfig.lr must be ... -> ahn2023.fig1.train.lr must be ...
            raise ConfigError(owner + msg[len(cls.__name__) :]) from None
        raise ConfigError(f"{owner}: {msg}") from None


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in update.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _nested_names(cls: type) -> set[str]:
    """The field names of every config nested in ``cls`` (the shorthands an override may use)."""
    hints = _hints(cls)
    out: set[str] = set()
    for f in _fields(cls).values():
        if dataclasses.is_dataclass(hints[f.name]):
            out |= set(_fields(hints[f.name])) | _nested_names(hints[f.name])
    return out


def nested_paths(cls: type, name: str, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every dotted path under the dataclass ``cls`` whose last part is the field ``name``, outermost first."""
    hints = _hints(cls)
    found = []
    for f in _fields(cls).values():
        path = (*prefix, f.name)
        if f.name == name:
            found.append(path)
        tp = hints[f.name]
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            found += nested_paths(tp, name, path)
    return found


def route_shorthand(cls: type, data: dict[str, Any], *, owner: str | None = None) -> dict[str, Any]:
    """Move each top-level key of ``data`` that is not a field of ``cls`` to the one nested config that has it.

    ``{"lr": 0.1}`` becomes ``{"train": {"lr": 0.1}}`` for a config with ``train: TrainConfig``; a name held by
    two nested configs is refused as ambiguous, and an unknown name is left for :func:`from_dict` to reject.
    """
    owner = owner or cls.__name__
    own = _fields(cls)
    out: dict[str, Any] = {}
    for key, value in data.items():
        *parents, last = [key] if key in own else _route(cls, key, owner)
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        merge = isinstance(value, dict) and isinstance(node.get(last), dict)
        node[last] = _deep_merge(node[last], value) if merge else value
    return out


def _route(cls: type, key: str, owner: str) -> list[str]:
    """The full path of the shorthand ``key`` (itself when no nested config has it: from_dict then rejects it)."""
    paths = [p for p in nested_paths(cls, key) if len(p) > 1]
    if len(paths) > 1:
        options = ", ".join(".".join(p) for p in paths)
        raise ConfigError(f"'{owner}.{key}' is ambiguous: it could be any of {options}; write the full path")
    return list(paths[0]) if paths else [key]


def to_dict(obj: Any) -> Any:
    """A JSON/YAML-ready dict of a (nested) dataclass."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {
            f.name: to_dict(getattr(obj, f.name))
            for f in dataclasses.fields(obj)
            if f.init and not f.name.startswith("_")
        }
    if isinstance(obj, tuple | list):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    if isinstance(obj, Path):
        return str(obj)
    return obj


def yaml_load(text: str, what: str = "YAML") -> Any:
    """Parse YAML with :class:`~iclab.core.safe_parse.YamlLoader` (a ``yaml.SafeLoader`` with YAML 1.2 floats,
    bounded: no anchors or aliases, no repeated keys, bounded size and nesting)."""
    return load_yaml_text(text, what=what)


def parse_override(item: str) -> tuple[list[str], Any]:
    """``'a.b=3'`` -> (['a', 'b'], 3); the value is parsed as YAML (numbers, lists, true/false, null)."""
    if "=" not in item:
        raise ConfigError(f"override must look like key.sub=value; got {item!r}")
    key, raw = item.split("=", 1)
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override key must be dotted names like train.lr; got {key!r}")
    if raw == "":
        return key.split("."), ""
    try:
        value = yaml_load(raw, what="the value")
    except DocumentError as e:
        raise ConfigError(f"override {item[:200]!r}: {e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"override {item!r}: the value is not valid YAML ({_yaml_problem(e)})") from None
    return key.split("."), value


def _yaml_problem(e: Exception) -> str:
    return " ".join(str(getattr(e, "problem", None) or e).split())[:200]


def apply_overrides(
    data: dict[str, Any], overrides: list[str] | tuple[str, ...], *, cls: type | None = None, owner: str | None = None
) -> dict[str, Any]:
    """Return a copy of ``data`` with each ``key.sub=value`` applied (the key path need not exist:
    validation by :func:`from_dict` catches unknown keys). With ``cls``, a first key that is not a field of
    ``cls`` is routed to the one nested config that has it (:func:`route_shorthand`): ``lr=0.1`` -> ``train.lr``."""
    out: dict[str, Any] = json.loads(json.dumps(data))
    for item in overrides:
        path, value = parse_override(item)
        if cls is not None and path[0] not in _fields(cls):
            path = [*_route(cls, path[0], owner or cls.__name__), *path[1:]]
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {part!r} is not a section")
        node[path[-1]] = value
    return out


def load_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} does not exist")
    try:
        data = load_yaml_file(p, what=f"config file {str(p)!r}")
    except DocumentError:
        raise
    except OSError as e:
        raise ConfigError(f"config file {str(p)!r} cannot be read ({e.strerror or e})") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {str(p)!r} is not valid YAML ({_yaml_problem(e)})") from None
    if data is None:  # an empty file: every default
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(p)!r} must hold a mapping at the top level; got {type(data).__name__}")
    return data


#: Field metadata of a setting whose default leaves a config's identity unchanged (:func:`identity`).
OMIT_DEFAULT = "iclab.omit_default"


def added_setting(default: Any) -> Any:
    """A dataclass field with ``default`` that leaves a config's identity unchanged while it holds that default.

    For a setting added to a config after runs were made with it: the run directories (:func:`config_hash`) and
    checkpoints made before keep matching the configs that do not use the new setting."""
    return dataclasses.field(default=default, metadata={OMIT_DEFAULT: True})


def identity(obj: Any) -> Any:
    """:func:`to_dict` less the :func:`added_setting` fields that hold their default: what makes two configs the
    same run (their hash, a checkpoint's match)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {
            f.name: identity(getattr(obj, f.name))
            for f in dataclasses.fields(obj)
            if f.init
            and not f.name.startswith("_")
            and not (f.metadata.get(OMIT_DEFAULT) and getattr(obj, f.name) == f.default)
        }
    if isinstance(obj, tuple | list):
        return [identity(v) for v in obj]
    if isinstance(obj, dict):
        return {k: identity(v) for k, v in obj.items()}
    return to_dict(obj)


def config_hash(obj: Any, length: int = 10) -> str:
    """A short stable hash of a config (dataclass or dict): same config, same run directory. Settings added later
    (:func:`added_setting`) count only when they differ from their default."""
    blob = json.dumps(identity(obj), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:length]
