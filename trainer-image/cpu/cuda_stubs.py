"""Stand-ins for CUDA shared libraries in the CPU trainer image: same name, same exported symbols.

The PyPI torch wheel links cuBLAS, cuFFT, cuSPARSE, NCCL, NVRTC... (2.9 GB) although a process without
a GPU never calls into them. A stub keeps the dynamic linker satisfied and weighs a few MB: each
exported function prints which library was called and exits with status 134; each object is
zero-filled storage of the real size (type_info objects keep their name); symbol versions and the
SONAME are the original's.

Invariants: a stub exports the original's defined dynamic symbols with their versions, types and
bindings, and its dependencies; nothing in it runs at load time. Usage: cuda_stubs.py LIBRARY...
(each replaced in place; binutils' readelf, as and ld on PATH). docs/images.md says which libraries
the CPU image stubs and how that was checked.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import subprocess
import sys
import tempfile
from pathlib import Path

# Exit status of a called stub: what an abort gives, so a crash looks like one.
STUB_EXIT_STATUS = 134
_SYMBOL_LINE = re.compile(
    r"^\s*\d+:\s+[0-9a-f]+\s+(?P<size>\d+|0x[0-9a-f]+)\s+(?P<type>\w+)\s+(?P<bind>\w+)\s+\w+\s+"
    r"(?P<ndx>\w+)\s+(?P<name>\S+)"
)
_VERSION_DEFINITION = re.compile(
    r"Rev: \d+\s+Flags: (?P<flags>\S+)\s+Index: \d+\s+Cnt: \d+\s+Name: (?P<name>\S+)"
)
_SONAME = re.compile(r"\(SONAME\)\s+Library soname: \[(?P<name>[^\]]+)\]")
_NEEDED = re.compile(r"\(NEEDED\)\s+Shared library: \[(?P<name>[^\]]+)\]")


@dataclasses.dataclass(frozen=True)
class Symbol:
    name: str
    kind: str  # FUNC, OBJECT, TLS, IFUNC
    bind: str  # GLOBAL, WEAK, UNIQUE
    size: int
    version: str | None
    default_version: bool  # name@@version (the one a new link takes), not name@version

    @property
    def versioned_name(self) -> str:
        if self.version is None:
            return self.name
        return f"{self.name}{'@@' if self.default_version else '@'}{self.version}"


@dataclasses.dataclass(frozen=True)
class LibraryInterface:
    soname: str
    needed: tuple[str, ...]  # its dependencies: what the original loads, the stub loads too
    versions: tuple[str, ...]  # the version definitions, without the base (the file's own name)
    symbols: tuple[Symbol, ...]


def _readelf(*args: str) -> str:
    return subprocess.run(["readelf", "-W", *args], check=True, capture_output=True, text=True).stdout


def parse_symbols(dyn_syms: str) -> list[Symbol]:
    """The defined symbols of `readelf -W --dyn-syms` output (undefined and absolute ones left out:
    the linker makes the version symbols itself)."""
    symbols = []
    for line in dyn_syms.splitlines():
        match = _SYMBOL_LINE.match(line)
        if not match or match["ndx"] in ("UND", "ABS") or match["type"] in ("NOTYPE", "SECTION", "FILE"):
            continue
        name, version, default = match["name"], None, False
        if "@@" in name:
            name, version = name.split("@@", 1)
            default = True
        elif "@" in name:
            name, version = name.split("@", 1)
        size = int(match["size"], 0)
        symbols.append(Symbol(name, match["type"], match["bind"], size, version, default))
    return symbols


def defined_names(library: Path) -> set[str]:
    """The names a library defines (any binding), without versions."""
    return {symbol.name for symbol in parse_symbols(_readelf("--dyn-syms", str(library)))}


def read_interface(library: Path, defined_elsewhere: frozenset[str] = frozenset()) -> LibraryInterface:
    """The interface a stub of `library` must offer. Weak and unique definitions are C++'s inline
    functions, templates, type_info objects and their statics: a library that stays real and defines
    one too keeps it (a stub's copy could interpose on it), so `defined_elsewhere` leaves those out."""
    dynamic = _readelf("-d", str(library))
    soname_match = _SONAME.search(dynamic)
    soname = soname_match["name"] if soname_match else library.name
    needed = tuple(m["name"] for m in _NEEDED.finditer(dynamic))
    versions = [
        m["name"]
        for m in _VERSION_DEFINITION.finditer(_readelf("-V", str(library)))
        if "BASE" not in m["flags"]
    ]
    symbols = [
        symbol
        for symbol in parse_symbols(_readelf("--dyn-syms", str(library)))
        if symbol.bind == "GLOBAL" or symbol.name not in defined_elsewhere
    ]
    return LibraryInterface(soname, needed, tuple(versions), tuple(symbols))


def _quoted(name: str) -> str:
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _type_directive(symbol: Symbol, label: str) -> str:
    if symbol.kind in ("FUNC", "IFUNC"):
        return f".type {label}, @function"
    if symbol.bind == "UNIQUE":
        return f".type {label}, @gnu_unique_object"
    return f".type {label}, @object"


def _object_body(symbol: Symbol, names: set[str]) -> list[str]:
    """Zeros of the real size; a type_info object points at its name, a type name holds it."""
    size = max(symbol.size, 1)
    if symbol.name.startswith("_ZTS"):
        text = symbol.name[4:]
        return [f".asciz {_quoted(text)}", *_padding(size - len(text) - 1)]
    if symbol.name.startswith("_ZTI") and size >= 16:
        name_label = "_ZTS" + symbol.name[4:]
        target = _quoted(name_label) if name_label in names else _local_name(name_label)
        return [".quad 0", f".quad {target}", *_padding(size - 16)]
    return [f".zero {size}"]


def _padding(size: int) -> list[str]:
    return [f".zero {size}"] if size > 0 else []


def _local_name(type_name: str) -> str:
    return _quoted(".Lname." + type_name)


# Functions of libtorch_cuda.so that `import torch` calls on every machine (found with an LD_AUDIT
# probe, docs/images.md): c10d's GIL checker hook (a reference to a function pointer that
# libtorch_python sets) and the constructor of the default NCCL options object that the Python
# bindings keep as a default argument (given a vtable whose every entry returns, so releasing it at
# exit does nothing). Every other function traps.
STATIC_STORAGE = frozenset({"_ZN4c10d15get_gil_checkerEv"})
INERT_CONSTRUCTORS = frozenset(
    {"_ZN4c10d16ProcessGroupNCCL7OptionsC1Eb", "_ZN4c10d16ProcessGroupNCCL7OptionsC2Eb"}
)
_INERT_VTABLE_ENTRIES = 64


def _preamble(soname: str) -> list[str]:
    """The shared routines: the trap, a function that returns zero, zeroed storage, an inert vtable."""
    message = f"ebbflow: {soname} is a stub in this CPU-only image; use the CUDA image on GPUs\\n"
    return [
        ".text",
        ".p2align 4",
        ".Ltrap:",
        "  mov $1, %eax",  # write(2, message, length)
        "  mov $2, %edi",
        "  lea .Lmessage(%rip), %rsi",
        f"  mov ${len(message) - 1}, %edx",  # the escaped newline is one byte
        "  syscall",
        "  mov $231, %eax",  # exit_group
        f"  mov ${STUB_EXIT_STATUS}, %edi",
        "  syscall",
        "  ud2",
        ".Lreturn_zero:",
        "  xor %eax, %eax",
        "  ret",
        ".Lstatic_storage:",
        "  lea .Lstorage(%rip), %rax",
        "  ret",
        ".Linert_constructor:",
        "  lea .Linert_vtable+16(%rip), %rax",  # past offset-to-top and type_info, as a real vptr
        "  mov %rax, (%rdi)",
        "  ret",
        ".section .rodata",
        f'.Lmessage: .ascii "{message}"',
        '.section .data.rel.ro,"aw"',
        ".p2align 4",
        ".Linert_vtable:",
        ".quad 0, 0",
        *[".quad .Lreturn_zero"] * _INERT_VTABLE_ENTRIES,
        ".bss",
        ".p2align 4",
        ".Lstorage: .zero 64",
    ]


def _function_target(name: str) -> str:
    if name in STATIC_STORAGE:
        return ".Lstatic_storage"
    if name in INERT_CONSTRUCTORS:
        return ".Linert_constructor"
    return ".Ltrap"


def _definition(symbol: Symbol, label: str, names: set[str]) -> list[str]:
    if symbol.kind in ("FUNC", "IFUNC"):
        return [f".set {label}, {_function_target(symbol.name)}"]
    size = max(symbol.size, 1)
    if symbol.kind == "TLS":
        section, body = '.section .tbss,"awT",@nobits', [f".zero {size}"]
    else:
        section, body = ".data", _object_body(symbol, names)
    return [section, ".p2align 4", f"{label}:", *body, f".size {label}, {size}"]


def assembly(interface: LibraryInterface) -> str:
    """GNU as source of the stub: the shared routines, then every exported name defined."""
    lines = _preamble(interface.soname)
    names = {s.name for s in interface.symbols}
    strings_needed = {
        "_ZTS" + s.name[4:] for s in interface.symbols if s.name.startswith("_ZTI") and s.size >= 16
    } - names
    lines.append(".section .rodata")
    for type_name in sorted(strings_needed):
        lines.append(f"{_local_name(type_name)}: .asciz {_quoted(type_name[4:])}")
    for index, symbol in enumerate(interface.symbols):
        # A versioned symbol (name@@version, or the hidden name@version) is defined under a name of
        # its own that .symver renames; an unversioned one is defined by name.
        versioned = symbol.version is not None
        label = f"__ebbflow_stub_{index}" if versioned else _quoted(symbol.name)
        lines += _definition(symbol, label, names)
        lines.append(_type_directive(symbol, label))
        if versioned:
            lines.append(f".symver {label}, {symbol.versioned_name}, remove")
        lines.append(f".weak {label}" if symbol.bind == "WEAK" else f".globl {label}")
    return "\n".join(lines) + "\n"


def version_script(interface: LibraryInterface) -> str | None:
    """The version nodes the symbols' .symver names refer to (None: an unversioned library)."""
    if not interface.versions:
        return None
    return "".join(f"{version} {{ }};\n" for version in interface.versions)


def build_stub(library: Path, output: Path, defined_elsewhere: frozenset[str]) -> LibraryInterface:
    interface = read_interface(library, defined_elsewhere)
    with tempfile.TemporaryDirectory() as work:
        source, obj, script = Path(work, "stub.s"), Path(work, "stub.o"), Path(work, "stub.map")
        source.write_text(assembly(interface))
        subprocess.run(["as", "--64", "-o", str(obj), str(source)], check=True)
        link = ["ld", "-shared", "-soname", interface.soname, "-o", str(output), str(obj)]
        # The same dependencies as the original, in its order: symbols that users of the original
        # find through them (libtorch_cuda's dependencies serve libtorch_python) are found still.
        nothing = Path(work, "empty.o")
        subprocess.run(["as", "--64", "-o", str(nothing), "/dev/null"], check=True)
        for name in interface.needed:
            empty = Path(work, "needed", name)
            empty.parent.mkdir(exist_ok=True)
            subprocess.run(["ld", "-shared", "-soname", name, "-o", str(empty), str(nothing)], check=True)
            link.append(str(empty))
        versions = version_script(interface)
        if versions is not None:
            script.write_text(versions)
            link[2:2] = ["--version-script", str(script)]
        subprocess.run(link, check=True)
    return interface


# What a CPU worker does: import torch, a training step, a gloo all-reduce; then the loaded libraries.
_PROBE = """
import os, tempfile, torch, torch.distributed as dist
store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
dist.init_process_group("gloo", store=store, rank=0, world_size=1)
model = torch.nn.Linear(8, 4)
optimizer = torch.optim.AdamW(model.parameters())
model(torch.randn(3, 8)).sum().backward()
dist.all_reduce(model.weight.grad)
optimizer.step()
dist.destroy_process_group()
print("\\n".join(sorted({line.split()[5] for line in open("/proc/self/maps") if ".so" in line.split()[-1]})))
"""


def loaded_by_cpu_training(python: str) -> set[Path]:
    """The shared libraries a CPU training process of `python` maps (run before stubbing)."""
    probe = subprocess.run([python, "-c", _PROBE], check=True, capture_output=True, text=True)
    return {Path(line).resolve() for line in probe.stdout.splitlines() if line.startswith("/")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("libraries", nargs="+", type=Path, help="replaced in place by their stubs")
    parser.add_argument(
        "--python",
        default=sys.executable,
        help="the interpreter whose CPU training decides which libraries stay real (default: this one)",
    )
    args = parser.parse_args(argv)
    stubbed = {library.resolve() for library in args.libraries}
    kept = loaded_by_cpu_training(args.python) - stubbed
    defined_elsewhere = frozenset().union(*(defined_names(library) for library in kept))
    for library in args.libraries:
        before = library.stat().st_size
        stub = library.with_name(library.name + ".stub")
        interface = build_stub(library, stub, defined_elsewhere)
        stub.chmod(library.stat().st_mode)
        stub.replace(library)
        print(
            f"{library}: {len(interface.symbols)} symbols, {before / 1e6:.1f} MB -> "
            f"{library.stat().st_size / 1e6:.2f} MB",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
