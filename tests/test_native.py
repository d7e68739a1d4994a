"""iclab.core.native: a package C kernel is built once per source and headers, loaded by ctypes, else None, and every
outcome is recorded (``iclab doctor``), warned about once (a fallback the user did not ask for) and pruned from the
cache.

These tests build small sources of their own into a temporary ``ICLAB_KERNEL_DIR`` with the kernels switched on, so
they also run under ``ICLAB_NATIVE=0`` (where the model kernels' torch code is tested)."""

from __future__ import annotations

import ctypes
import importlib
import os
import re
import time
import warnings

import pytest
import torch
from typer.testing import CliRunner

from iclab import cli
from iclab.core import native

can_build = native.find_compiler() is not None and native.cpu_capability().startswith(("AVX2", "AVX512"))
needs_compiler = pytest.mark.skipif(not can_build, reason="no C compiler or no AVX2 here")
VALUE = {"value": ([], ctypes.c_int)}


@pytest.fixture(autouse=True)
def fresh(tmp_path, monkeypatch):
    """A new process as far as native is concerned: kernels on, nothing loaded, recorded or warned, an empty cache."""
    monkeypatch.setenv("ICLAB_KERNEL_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(native, "ENABLED", True)
    monkeypatch.setattr(native, "_loaded", {})
    monkeypatch.setattr(native, "_records", {})
    monkeypatch.setattr(native, "_warned", set())
    monkeypatch.setattr(native, "_pruned", [])


def _kernel(folder, value: int):
    (folder / "_k.h").write_text(f"#define VALUE {value}\n")
    src = folder / "_k.c"
    src.write_text('#include "_k.h"\nint value(void) { return VALUE; }\n')
    return src


def _record(src):
    return next(r for r in native.records() if r.source == src)


def _native_warnings(record: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, native.NativeKernelWarning)]


@needs_compiler
def test_a_changed_header_is_rebuilt(tmp_path, monkeypatch) -> None:
    src = _kernel(tmp_path, 3)
    assert native.load(src, VALUE).value() == 3
    assert native.load(src, VALUE) is native.load(src, VALUE)  # once per process
    assert _record(src).status == "built" and _record(src).path.parent == tmp_path / "cache"
    _kernel(tmp_path, 7)
    monkeypatch.setattr(native, "_loaded", {})  # a new process
    assert native.load(src, VALUE).value() == 7
    assert len(list((tmp_path / "cache").glob("k-*.so"))) == 2  # one build per source version, nothing half-written
    _kernel(tmp_path, 3)
    monkeypatch.setattr(native, "_loaded", {})
    assert native.load(src, VALUE).value() == 3 and _record(src).status == "loaded"  # from the cache


@needs_compiler
def test_a_failed_build_is_none_and_warns_once(tmp_path) -> None:
    src = tmp_path / "_bad.c"
    src.write_text("this is not C\n")
    with pytest.warns(native.NativeKernelWarning) as caught:
        assert native.load(src, {}) is None
    assert not list((tmp_path / "cache").glob("*.so"))
    r = _record(src)
    assert r.status == "fallback" and r.reason.startswith("build failed: _bad.c:1:1: error:"), r.reason
    (message,) = _native_warnings(caught.list)
    assert "_bad.c" in message and r.reason in message and "slower" in message and "\n" not in message
    with warnings.catch_warnings(record=True) as again:  # the same kernel at another shape: no second warning
        warnings.simplefilter("always")
        assert native.load(src, {}, defines={"DIM": 4}) is None
    assert _native_warnings(again) == []
    assert [r.name for r in native.records()] == ["_bad.c", "_bad.c DIM=4"]


def test_the_warning_names_the_slowdown(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.warns(native.NativeKernelWarning, match="expect a step about 4× slower") as caught:
        assert native.load(_kernel(tmp_path, 1), VALUE, cost="a step about 4× slower") is None
    assert "_k.c" in _native_warnings(caught.list)[0]


@pytest.mark.parametrize("what, module, args", cli.DOCTOR_KERNELS, ids=[m for _, m, _ in cli.DOCTOR_KERNELS])
def test_each_package_kernel_warns_with_its_slowdown(what, module, args, tmp_path, monkeypatch) -> None:
    """Every package kernel's first fallback names it, the reason and the factor docs/performance.md measured."""
    kernel = importlib.import_module(module)
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.warns(native.NativeKernelWarning) as caught:
        assert kernel.native(*args) is None
    (message,) = _native_warnings(caught.list)
    assert kernel._SOURCE.name in message and "no C compiler" in message and f"expect {kernel.COST}." in message
    assert re.search(r"\d× .*slower$", kernel.COST), kernel.COST  # a measured factor


def test_no_compiler_from_cc(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    assert native.compiler() is None and native.find_compiler() is None
    with pytest.warns(native.NativeKernelWarning, match="no C compiler"):
        assert native.load(_kernel(tmp_path, 1), VALUE) is None
    assert _record(tmp_path / "_k.c").reason == f"no C compiler: CC={tmp_path / 'no-such-cc'} is not a program"


def test_no_compiler_on_path(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(native.shutil, "which", lambda name: None)
    with pytest.warns(native.NativeKernelWarning, match="no cc or gcc on PATH"):
        assert native.load(_kernel(tmp_path, 1), VALUE) is None
    assert native.unavailable() == "no C compiler: no cc or gcc on PATH"


def test_no_avx2(tmp_path, monkeypatch) -> None:
    """An ARM or pre-AVX2 CPU: no build is tried."""
    monkeypatch.setattr(native, "cpu_capability", lambda: "DEFAULT")
    with pytest.warns(native.NativeKernelWarning, match=r"no AVX2 \+ FMA on this CPU \(torch reports DEFAULT\)"):
        assert native.load(_kernel(tmp_path, 1), VALUE) is None
    assert native.compiler() is None and native.wide_flags() == ()
    assert not (tmp_path / "cache").exists()


def test_iclab_native_0_falls_back_quietly(tmp_path, monkeypatch) -> None:
    """The user asked for the torch code: no warning, and the record (``iclab doctor``) says why."""
    monkeypatch.setattr(native, "ENABLED", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert native.load(_kernel(tmp_path, 1), VALUE) is None
    assert _native_warnings(caught) == []
    assert _record(tmp_path / "_k.c").reason == "disabled by ICLAB_NATIVE=0"
    assert native.compiler() is None and native.unavailable() == "disabled by ICLAB_NATIVE=0"


@needs_compiler
def test_an_unwritable_cache_falls_back(tmp_path, monkeypatch) -> None:
    """A cache directory that cannot be created (here: a file is in the way; as root a chmod would not stop it)."""
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("ICLAB_KERNEL_DIR", str(tmp_path / "file" / "kernels"))
    with pytest.warns(native.NativeKernelWarning, match="not writable"):
        assert native.load(_kernel(tmp_path, 1), VALUE) is None
    assert _record(tmp_path / "_k.c").reason.startswith(f"cache dir {tmp_path / 'file' / 'kernels'} not writable")


@needs_compiler
def test_a_missing_function_is_a_fallback(tmp_path) -> None:
    with pytest.warns(native.NativeKernelWarning, match="absent"):
        assert native.load(_kernel(tmp_path, 1), {"absent": ([], ctypes.c_int)}) is None
    assert _record(tmp_path / "_k.c").status == "fallback"


@needs_compiler
def test_a_rejected_avx512_build_falls_back_to_avx2(tmp_path, monkeypatch) -> None:
    """A compiler that refuses the AVX-512 flags (faked by a flag no compiler has): the AVX2 build of the same source
    runs, recorded with the reason, and nothing warns (it is still the C kernel)."""
    monkeypatch.setattr(native, "WIDE_FLAGS", ("-mno-such-avx512-flag",))
    monkeypatch.setattr(native, "wide_flags", lambda: native.WIDE_FLAGS)
    src = tmp_path / "_w.c"
    src.write_text("int value(void) {\n#ifdef __AVX512F__\n return 512;\n#else\n return 2;\n#endif\n}\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lib = native.load(src, VALUE, wide=True)
    assert _native_warnings(caught) == []
    assert lib is not None and lib.value() == 2
    r = _record(src)
    assert r.status == "built" and r.isa == "AVX2" and r.flags == ("-mno-such-avx512-flag",)
    assert r.reason.startswith("AVX-512 build rejected, the AVX2 build runs (build failed:"), r.reason
    assert "-mno-such-avx512-flag" in r.reason


@needs_compiler
def test_defines_build_one_library_per_value(tmp_path) -> None:
    """A kernel specialised to a shape (``defines``) is one library per value, each cached under its own hash; the
    AVX-512 flags join the build only where the CPU has AVX-512."""
    src = tmp_path / "_d.c"
    src.write_text("int value(void) { return WIDTH * 10 + __AVX2__; }\n")
    assert native.load(src, VALUE, defines={"WIDTH": 3}).value() == 31
    assert native.load(src, VALUE, defines={"WIDTH": 5}).value() == 51
    assert native.load(src, VALUE, defines={"WIDTH": 3}) is native.load(src, VALUE, defines={"WIDTH": 3})
    assert len(list((tmp_path / "cache").glob("d-*.so"))) == 2
    wide = native.wide_flags()
    assert wide == () or wide == ("-mavx512f", "-mavx512vl")
    assert (wide != ()) == torch.backends.cpu.get_cpu_capability().startswith("AVX512")
    assert [r.name for r in native.records()] == ["_d.c WIDTH=3", "_d.c WIDTH=5"]


def _files(folder, ages_days: dict[str, float]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    now = time.time()
    for name, age in ages_days.items():
        path = folder / name
        path.mkdir() if name.startswith("tmp") else path.write_bytes(b"\0" * 100)
        os.utime(path, (now - age * 86400, now - age * 86400))


@needs_compiler
def test_prune_removes_stale_and_excess_libraries_never_one_in_use(tmp_path) -> None:
    cache = tmp_path / "cache"
    lib = native.load(_kernel(tmp_path, 1), VALUE)
    (used,) = cache.glob("k-*.so")
    os.utime(used, (time.time() - 90 * 86400,) * 2)  # old, but this process loaded it
    _files(cache, {"a-1.so": 40, "b-1.so": 3, "c-1.so": 2, "d-1.so": 1, "tmpdead": 2, "tmpbusy": 0.1, "notes.txt": 99})
    removed = native.prune(cache, max_age_days=30, keep=3)
    assert sorted(p.name for p in removed) == ["a-1.so", "b-1.so", "tmpdead"]  # stale, least recent, a dead build
    assert sorted(p.name for p in cache.iterdir()) == ["c-1.so", "d-1.so", "k-" + used.name[2:], "notes.txt", "tmpbusy"]
    assert lib.value() == 1 and native.cache_usage(cache) == (3, used.stat().st_size + 200)
    assert native.prune(cache, max_age_days=30, keep=3) == []


@needs_compiler
def test_a_build_prunes_and_a_load_marks_its_use(tmp_path, monkeypatch) -> None:
    cache = tmp_path / "cache"
    _files(cache, {"old-1.so": native.PRUNE_DAYS + 1, "recent-1.so": 1})
    src = _kernel(tmp_path, 1)
    native.load(src, VALUE)  # built: the cache is pruned
    assert sorted(p.name for p in cache.glob("*.so")) == sorted(["recent-1.so", _record(src).path.name])
    assert [p.name for p in native.pruned()] == ["old-1.so"]
    os.utime(_record(src).path, (time.time() - 10 * 86400,) * 2)
    monkeypatch.setattr(native, "_loaded", {})  # a new process loads it from the cache: now its last use
    native.load(src, VALUE)
    assert _record(src).status == "loaded" and time.time() - _record(src).path.stat().st_mtime < 60


def _doctor(*args: str) -> str:
    result = CliRunner().invoke(cli.app, ["doctor", *args], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.output


def test_doctor_reports_every_kernel_disabled(monkeypatch) -> None:
    """ICLAB_NATIVE=0: every package kernel a fallback, with the reason, and the system it looked at."""
    monkeypatch.setattr(native, "ENABLED", False)
    out = _doctor()
    for line in ("python", "torch", "CPU", "avx2", "C compiler", "ICLAB_NATIVE", "kernel cache"):
        assert line in out
    sources = ("_kernel_attn.c", "_kv_softmax.c", "_quad_form.c", "_bilinear.c DIM=13 LIVE=5", "_query_attn.c DIM=5",
               "_sym_abs.c")  # fmt: skip
    for source in sources:
        row = next(line for line in out.splitlines() if source in line)
        assert "fallback" in row and "disabled by ICLAB_NATIVE=0" in row, row


@needs_compiler
def test_doctor_builds_the_kernels_and_prunes(tmp_path, monkeypatch) -> None:
    """Where a compiler is, doctor builds (here: one small package kernel, to keep the test short) and says so."""
    monkeypatch.setattr(cli, "DOCTOR_KERNELS", (("the softmax head", "iclab.models._categorical_fast", ()),))
    out = _doctor()
    row = next(line for line in out.splitlines() if "_kv_softmax.c" in line)
    assert "built" in row and "AVX2" in row and "kv_softmax-" in row, row
    assert "1 libraries" in out and "0 pruned now" in out
    _files(tmp_path / "cache", {"stale-1.so": native.PRUNE_DAYS + 1})
    assert "2 libraries" in _doctor()
    out = _doctor("--prune")
    assert "1 libraries" in out and "1 pruned now" in out
    assert list((tmp_path / "cache").glob("*.so")) == [_record(native.records()[0].source).path]
