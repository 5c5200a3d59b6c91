"""trainer-image/cpu/cuda_stubs.py: a stub loads wherever its original did and keeps the promises the
CPU image relies on. A small C++ library with what the CUDA libraries export (versioned functions, a
hidden older version, objects, thread-locals, a polymorphic class's type_info, a weak inline function
a real neighbour defines too) is built with g++, a program is linked against it, and then run with
the stub in its place."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(shutil.which("g++") is None or shutil.which("ld") is None, reason="needs g++"),
]

SCRIPT = Path(__file__).resolve().parents[2] / "trainer-image" / "cpu" / "cuda_stubs.py"

LIBRARY = r"""
#include <typeinfo>
extern "C" int gpu_add(int a, int b) { return a + b; }
extern "C" int gpu_add_v1(int a, int b) { return a - b; }
__asm__(".symver gpu_add_v1, gpu_add@LIBGPU_1");
extern "C" { int gpu_table[16] = {1, 2, 3}; __thread int gpu_tls[4] = {7}; }
struct Kernel { virtual ~Kernel(); virtual int run(); };
Kernel::~Kernel() {}
int Kernel::run() { return 5; }
extern "C" const char *kernel_type_name() { return typeid(Kernel).name(); }
inline int shared_inline() { return 42; }
extern "C" int (*gpu_inline_address())() { return &shared_inline; }
extern "C" void get_gil_checker_like() {}
"""
VERSIONS = "LIBGPU_1 { }; LIBGPU_2 { global: gpu_add; } LIBGPU_1;"

PROGRAM = r"""
#include <cstdio>
#include <cstring>
#include <typeinfo>
extern "C" { int gpu_add(int, int); extern int gpu_table[16]; const char *kernel_type_name(); }
struct Kernel { virtual ~Kernel(); virtual int run(); };
int main(int argc, char **argv) {
  std::printf("table %d %d\n", gpu_table[0], gpu_table[15]);
  std::printf("type %s\n", typeid(Kernel).name());
  std::fflush(stdout);
  if (argc > 1) std::printf("sum %d\n", gpu_add(2, 3));
  return 0;
}
"""


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cuda_stubs", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["cuda_stubs"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """libgpu.so.1 and a program linked against it, in one folder."""
    folder = tmp_path_factory.mktemp("stubs")
    (folder / "gpu.cpp").write_text(LIBRARY)
    (folder / "gpu.map").write_text(VERSIONS)
    (folder / "main.cpp").write_text(PROGRAM)
    subprocess.run(
        ["g++", "-shared", "-fPIC", "-O1", "-o", "libgpu.so.1", "-Wl,-soname,libgpu.so.1",
         "-Wl,--version-script,gpu.map", "gpu.cpp"],
        cwd=folder, check=True,
    )  # fmt: skip
    subprocess.run(
        ["g++", "-o", "main", "main.cpp", "libgpu.so.1", "-Wl,-rpath,$ORIGIN"], cwd=folder, check=True
    )
    return folder


def _run(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(folder / "main"), *args], capture_output=True, text=True, timeout=30)


def test_the_original_works(built: Path) -> None:
    result = _run(built, "call")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "table 1 0\ntype 6Kernel\nsum 5\n"


def test_a_stub_exports_the_same_names_with_their_versions(built: Path) -> None:
    stubs = _load_script()
    original = stubs.read_interface(built / "libgpu.so.1")
    stub = built / "stub" / "libgpu.so.1"
    stub.parent.mkdir(exist_ok=True)
    stubs.build_stub(built / "libgpu.so.1", stub, frozenset())
    rebuilt = stubs.read_interface(stub)
    assert rebuilt.soname == original.soname == "libgpu.so.1"
    assert set(rebuilt.versions) == set(original.versions) == {"LIBGPU_1", "LIBGPU_2"}
    assert {s.versioned_name for s in rebuilt.symbols} == {s.versioned_name for s in original.symbols}
    assert "gpu_add@LIBGPU_1" in {s.versioned_name for s in rebuilt.symbols}
    sizes = {s.name: (s.kind, s.size) for s in rebuilt.symbols}
    assert sizes["gpu_table"] == ("OBJECT", 64) and sizes["gpu_tls"] == ("TLS", 16)
    assert stub.stat().st_size < (built / "libgpu.so.1").stat().st_size


def test_a_program_loads_the_stub_reads_zeros_and_type_names_and_a_call_exits_134(built: Path) -> None:
    stubs = _load_script()
    stubs.build_stub(built / "libgpu.so.1", built / "libgpu.so.1.stub", frozenset())
    shutil.copy2(built / "libgpu.so.1", built / "libgpu.so.1.real")
    (built / "libgpu.so.1.stub").replace(built / "libgpu.so.1")
    try:
        loaded = _run(built)
        assert loaded.returncode == 0, loaded.stderr
        assert loaded.stdout == "table 0 0\ntype 6Kernel\n"
        called = _run(built, "call")
        assert called.returncode == stubs.STUB_EXIT_STATUS
        assert "libgpu.so.1 is a stub in this CPU-only image" in called.stderr
        assert "sum" not in called.stdout
    finally:
        (built / "libgpu.so.1.real").replace(built / "libgpu.so.1")


def test_weak_definitions_a_real_library_has_too_are_left_to_it(built: Path) -> None:
    stubs = _load_script()
    everything = stubs.read_interface(built / "libgpu.so.1")
    weak = {s.name for s in everything.symbols if s.bind in ("WEAK", "UNIQUE")}
    assert weak, "the library should export C++ weak definitions (type_info, inline functions)"
    kept = stubs.read_interface(built / "libgpu.so.1", frozenset(weak))
    assert {s.name for s in kept.symbols} == {s.name for s in everything.symbols} - weak
    assert "gpu_add" in {s.name for s in kept.symbols}
