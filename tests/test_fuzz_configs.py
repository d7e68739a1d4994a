"""Hostile configs and overrides: every experiment's config and the ``iclab train`` YAML either resolve or raise a
ConfigError (IclabError) naming the problem, never another exception. The corpus of inputs that once broke
something, or might, is tests/data/hostile_inputs.yaml; hypothesis generates the rest."""

from __future__ import annotations

import contextlib
import dataclasses
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from iclab.core.config import apply_overrides, load_yaml
from iclab.core.errors import IclabError
from iclab.experiments.registry import all_experiments
from iclab.experiments.runner import resolve_config
from iclab.training.run_config import parse_run_config

HOSTILE = yaml.safe_load((Path(__file__).parent / "data" / "hostile_inputs.yaml").read_text())
EXPERIMENTS = sorted(all_experiments())


def _keys(cls: type, prefix: str = "") -> list[str]:
    out = []
    for f in dataclasses.fields(cls):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default):
            out += _keys(type(default), f"{prefix}{f.name}.")
        else:
            out.append(prefix + f.name)
    return out


def _resolve_or_config_error(name: str, overrides: list[str]) -> None:
    exp = all_experiments()[name]
    with contextlib.suppress(IclabError):  # a clear, named refusal; anything else fails the test
        resolve_config(exp, "smoke", overrides, None)


def _one_key_per_type(name: str) -> list[str]:
    """One field of each distinct declared type in the experiment's config (the coercion depends on the type)."""
    cls, seen, keys = all_experiments()[name].config, set(), []
    for key in _keys(cls):
        *sections, leaf = key.split(".")
        tp = cls
        for part in sections:
            tp = type(getattr(tp(), part))
        hint = str(typing.get_type_hints(tp).get(leaf))
        if (hint, len(sections)) not in seen:
            seen.add((hint, len(sections)))
            keys.append(key)
    return keys


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_hostile_corpus_on_every_type(name: str) -> None:
    """One field of each type in every experiment, given each hostile value of the corpus: resolved or refused."""
    for key in _one_key_per_type(name):
        for value in HOSTILE["values"]:
            _resolve_or_config_error(name, [f"{key}={value}"])
    for item in HOSTILE["overrides"]:
        _resolve_or_config_error(name, [item])


@pytest.mark.slow
@pytest.mark.parametrize("name", EXPERIMENTS)
def test_hostile_corpus_on_every_field(name: str) -> None:
    """Every field of every experiment, given each hostile value of the corpus (slow: ~40 000 configs)."""
    for key in _keys(all_experiments()[name].config):
        for value in HOSTILE["values"]:
            _resolve_or_config_error(name, [f"{key}={value}"])


_values = st.one_of(
    st.text(max_size=30),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(HOSTILE["values"]),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(EXPERIMENTS), data=st.data())
def test_generated_overrides(name: str, data: st.DataObject) -> None:
    keys = [*_keys(all_experiments()[name].config), "nope", "train.nope", "tol.x.y", ""]
    key = data.draw(st.one_of(st.sampled_from(keys), st.text(max_size=20)))
    value = data.draw(_values)
    _resolve_or_config_error(name, [f"{key}={value}"])


@settings(max_examples=150, deadline=None)
@given(
    doc=st.recursive(
        st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=10)),
        lambda inner: st.one_of(
            st.lists(inner, max_size=3),
            st.dictionaries(st.sampled_from(["task", "model", "train", "lr", "steps", "d", "n", "kind", "x"]), inner),
        ),
        max_leaves=12,
    )
)
def test_generated_train_yaml(tmp_path_factory, doc) -> None:
    """``iclab train --config``: any YAML document parses to a RunConfig or raises a named IclabError."""
    path = tmp_path_factory.mktemp("yaml") / "c.yaml"
    path.write_text(yaml.safe_dump(doc))
    with contextlib.suppress(IclabError):
        parse_run_config(apply_overrides(load_yaml(path), []))


@pytest.mark.parametrize("text", HOSTILE["yaml_documents"])
def test_hostile_yaml_documents(tmp_path, text: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(IclabError):
        parse_run_config(apply_overrides(load_yaml(path), []))


# --- resource bombs and hostile command-line values ------------------------------------------------------------------

BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=False)
)


def _cli(*args: str) -> Any:
    from typer.testing import CliRunner

    from iclab.cli import app

    return CliRunner().invoke(app, list(args))


def test_alias_bomb_to_train_config_and_as_override_is_one_line(tmp_path) -> None:
    """A 0.5 kB YAML alias bomb as ``iclab train --config`` or as an override value: refused at once, exit 2."""
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB)
    for args in (
        ["train", "--config", str(path)],
        ["run", "ahn2023.theorem2", "--preset", "smoke", "lr=" + "{" + BOMB.strip().replace("\n", ", ") + "}"],
    ):
        result = _cli(*args, *(["--out", str(tmp_path)] if args[0] == "run" else []))
        assert result.exit_code == 2 and "anchors and aliases" in result.output, result.output
        assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["run", "ahn2023.theorem2", "--out", ""], "must name a folder"),
        (["sweep", "examples/sweeps/smoke.yaml", "--out", " "], "must name a folder"),
        (["report", "--out", ""], "must name a folder"),
        (["report", "--port", "99999"], "--port"),
        (["report", "--port", "-1"], "--port"),
    ],
)
def test_hostile_command_line_values_are_refused(args: list[str], fragment: str) -> None:
    result = _cli(*args)
    assert result.exit_code == 2 and fragment in result.output, result.output
    assert "Traceback" not in result.output


def test_serve_answers_regular_files_under_out_only(tmp_path) -> None:
    """``iclab report --serve``: a symbolic link in OUT to /etc (or to a file inside OUT) answers 404; a page, 200."""
    import threading
    import urllib.error
    import urllib.request

    from iclab.reporting.site import serve

    (tmp_path / "report").mkdir()
    (tmp_path / "report" / "index.html").write_text("<p>report</p>")
    (tmp_path / "etc").symlink_to("/etc")
    (tmp_path / "link.html").symlink_to(tmp_path / "report" / "index.html")
    httpd = serve(tmp_path, 0)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{httpd.server_port}"

    def status(path: str) -> int:
        try:
            with urllib.request.urlopen(base + path, timeout=10) as r:
                return int(r.status)
        except urllib.error.HTTPError as e:
            return e.code

    try:
        assert status("/report/index.html") == 200 and status("/report/") == 200
        for path in ("/etc/passwd", "/etc/hostname", "/link.html", "/etc/", "/../../etc/passwd", "/%2e%2e/etc/passwd"):
            assert status(path) == 404, path
        assert status("/") == 404  # a directory without index.html: no listing
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)
