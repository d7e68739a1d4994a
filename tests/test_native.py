"""iclab.core.native: a package C kernel is built once per source and headers, loaded by ctypes, else None."""

from __future__ import annotations

import ctypes

import pytest
import torch

from iclab.core import native

pytestmark = pytest.mark.skipif(native.compiler() is None, reason="no C compiler or no AVX2 here")


def _kernel(folder, value: int):
    (folder / "_k.h").write_text(f"#define VALUE {value}\n")
    src = folder / "_k.c"
    src.write_text('#include "_k.h"\nint value(void) { return VALUE; }\n')
    return src


def test_a_changed_header_is_rebuilt(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("ICLAB_KERNEL_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(native, "_loaded", {})
    src = _kernel(tmp_path, 3)
    sig = {"value": ([], ctypes.c_int)}
    assert native.load(src, sig).value() == 3
    assert native.load(src, sig) is native.load(src, sig)  # once per process
    _kernel(tmp_path, 7)
    monkeypatch.setattr(native, "_loaded", {})  # a new process
    assert native.load(src, sig).value() == 7
    assert len(list((tmp_path / "cache").glob("k-*.so"))) == 2  # one build per source version, nothing half-written


def test_a_failed_build_is_none(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("ICLAB_KERNEL_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(native, "_loaded", {})
    src = tmp_path / "_bad.c"
    src.write_text("this is not C\n")
    assert native.load(src, {}) is None
    assert not list((tmp_path / "cache").glob("*.so"))


def test_defines_build_one_library_per_value(tmp_path, monkeypatch) -> None:
    """A kernel specialised to a shape (``defines``) is one library per value, each cached under its own hash; the
    AVX-512 flags join the build only where the CPU has AVX-512."""
    monkeypatch.setenv("ICLAB_KERNEL_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(native, "_loaded", {})
    src = tmp_path / "_d.c"
    src.write_text("int value(void) { return WIDTH * 10 + __AVX2__; }\n")
    sig = {"value": ([], ctypes.c_int)}
    assert native.load(src, sig, defines={"WIDTH": 3}).value() == 31
    assert native.load(src, sig, defines={"WIDTH": 5}).value() == 51
    assert native.load(src, sig, defines={"WIDTH": 3}) is native.load(src, sig, defines={"WIDTH": 3})
    assert len(list((tmp_path / "cache").glob("d-*.so"))) == 2
    wide = native.wide_flags()
    assert wide == () or wide == ("-mavx512f", "-mavx512vl")
    assert (wide != ()) == torch.backends.cpu.get_cpu_capability().startswith("AVX512")
