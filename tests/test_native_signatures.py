"""The ctypes signatures written by hand in Python match the C functions each kernel exports.

ctypes cannot read a library's prototypes: a wrong ``argtypes`` entry (an int where C takes a long, a float where it
takes a double, one argument too few) passes garbage without an error. So each kernel source is run through the C
preprocessor as a build would (its ``-D`` values; the ``name_f32`` / ``name_f64`` instances the sources make with
``NAME(f)`` and ``#include __FILE__`` are then written out), its functions with external linkage are read from the
result, and each one's return type and parameters (pointer, int, long, float, double) are compared with the
``(argtypes, restype)`` its Python module declares; every exported function must be declared and every declared one
exported."""

from __future__ import annotations

import ctypes
import platform
import re
import subprocess
from pathlib import Path

import pytest

from iclab.core import native, symabs
from iclab.models import _bilinear_fast, _categorical_fast, _kernel_fast, _moment_fast, _quad_form, _query_fast
from iclab.tasks import polynomial
from iclab.training import _reduced_flow, lbfgs

pytestmark = pytest.mark.skipif(
    native.find_compiler() is None or platform.machine().lower() not in ("x86_64", "amd64"),
    reason="the sources need a C preprocessor and x86 intrinsics headers",
)

#: each kernel's module (its ``_SOURCE`` and ``_SIGNATURES``) and the ``-D`` values of a representative build
KERNELS = {
    "kernel_attn": (_kernel_fast, {}),
    "kv_softmax": (_categorical_fast, {}),
    "quad_form": (_quad_form, {}),
    "bilinear": (_bilinear_fast, {"DIM": 13, "LIVE": 5}),
    "query_attn": (_query_fast, {"DIM": 5}),
    "moment_attn": (_moment_fast, {"DIM": 6}),
    "sym_abs": (symabs, {}),
    "polynomial": (polynomial, {}),
    "lbfgs": (lbfgs, {}),
    "reduced_flow": (_reduced_flow, {}),
}

#: C scalar types as ctypes has them (qualifiers dropped); every pointer is "pointer"
C_SCALARS = {
    "int": ctypes.c_int,
    "long": ctypes.c_long,
    "long int": ctypes.c_long,
    "long long": ctypes.c_longlong,
    "unsigned": ctypes.c_uint,
    "unsigned int": ctypes.c_uint,
    "size_t": ctypes.c_size_t,
    "float": ctypes.c_float,
    "double": ctypes.c_double,
    "void": None,
}
_QUALIFIERS = {"const", "volatile", "restrict", "__restrict", "__restrict__", "extern", "inline"}


def exported(source: Path, defines: dict[str, int]) -> dict[str, tuple[object, list[object]]]:
    """{name: (return kind, [parameter kinds])} of the functions with external linkage that ``source`` defines; a kind
    is a ctypes scalar type, None (void) or "pointer"."""
    cc = native.find_compiler()
    flags = [*native.FLAGS[:3], *(f"-D{k}={v}" for k, v in defines.items())]
    text = subprocess.run([cc, "-E", *flags, str(source)], capture_output=True, text=True, check=True).stdout
    own = _own_text(text, source.parent)
    found: dict[str, tuple[object, list[object]]] = {}
    for head in _top_level_heads(own):
        m = re.fullmatch(r"(?P<ret>[A-Za-z_][\w\s*]*?)\s*\b(?P<name>[A-Za-z_]\w*)\s*\((?P<params>[^()]*)\)", head)
        if m is None or re.search(r"\b(static|typedef|struct|enum|union)\b", m["ret"]):
            continue
        params = [p.strip() for p in m["params"].split(",")]
        kinds = [] if params in ([""], ["void"]) else [_kind(p, named=True) for p in params]
        found[m["name"]] = (_kind(m["ret"], named=False), kinds)
    return found


def _own_text(text: str, folder: Path) -> str:
    """The preprocessed text that comes from the kernel's folder (its source and headers), not from system headers:
    the line markers ``# <line> "<file>"`` say where each part comes from."""
    keep, parts = False, []
    for line in text.splitlines():
        marker = re.match(r'#\s*\d+\s+"([^"]*)"', line)
        if marker:
            keep = Path(marker[1]).parent.resolve() == folder.resolve()
        elif keep:
            parts.append(line)
    return "\n".join(parts)


def _top_level_heads(text: str) -> list[str]:
    """What stands before each ``{`` that opens a block at file level (function heads, struct and enum bodies,
    initialisers), whitespace collapsed."""
    heads, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "{":
            if depth == 0:
                heads.append(" ".join(text[start:i].split()))
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                start = i + 1
        elif ch == ";" and depth == 0:
            start = i + 1
    return heads


def _kind(decl: str, *, named: bool) -> object:
    """ "pointer" or the ctypes type of one C declaration (``named``: a parameter, whose last word is its name)."""
    if "*" in decl or "[" in decl:
        return "pointer"
    words = [w for w in decl.split() if w not in _QUALIFIERS]
    if named:
        words = words[:-1]
    return C_SCALARS[" ".join(words)]


def _py_kind(t: object) -> object:
    if t is ctypes.c_void_p or t is ctypes.c_char_p or (isinstance(t, type) and issubclass(t, ctypes._Pointer)):
        return "pointer"
    return t


@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_python_signatures_match_the_c_prototypes(kernel: str) -> None:
    module, defines = KERNELS[kernel]
    c = exported(module._SOURCE, defines)
    assert c, f"no exported function found in {module._SOURCE.name}"
    py = {name: (_py_kind(res), [_py_kind(a) for a in args]) for name, (args, res) in module._SIGNATURES.items()}
    assert sorted(py) == sorted(c), f"{module._SOURCE.name}: exported and declared functions differ"
    for name, (ret, params) in c.items():
        got_ret, got_params = py[name]
        assert got_ret == ret, f"{name}: C returns {ret}, Python declares {got_ret}"
        assert len(got_params) == len(params), f"{name}: C takes {len(params)} arguments, Python {len(got_params)}"
        for i, (want, got) in enumerate(zip(params, got_params, strict=True)):
            assert got == want, f"{name} argument {i}: C {want}, Python {got}"


def test_the_parser_reads_instances_qualifiers_and_linkage(tmp_path) -> None:
    """``NAME(f)`` instances per real type, const pointers, long and double parameters, void lists; static functions
    and struct bodies are not exported."""
    src = tmp_path / "_t.c"
    src.write_text(
        "#ifndef T_REAL\n#define T_REAL 32\n#include __FILE__\n#undef T_REAL\n#define T_REAL 64\n#include __FILE__\n"
        "int t_lanes(void) { return 8; }\n#else\n#undef real\n#undef NAME\n"
        "#if T_REAL == 32\n#define real float\n#define NAME(f) f##_f32\n"
        "#else\n#define real double\n#define NAME(f) f##_f64\n#endif\n"
        "typedef struct { int a; } NAME(S);\nstatic int NAME(helper)(int x) { return x; }\n"
        "long NAME(t_run)(int B, long n, real scale, const real *restrict x,\n  real *y) { return B; }\n#endif\n"
    )
    R, P = ctypes.c_float, "pointer"
    assert exported(src, {}) == {
        "t_run_f32": (ctypes.c_long, [ctypes.c_int, ctypes.c_long, R, P, P]),
        "t_run_f64": (ctypes.c_long, [ctypes.c_int, ctypes.c_long, ctypes.c_double, P, P]),
        "t_lanes": (ctypes.c_int, []),
    }
