"""Build script: the pure-Python package, the CPU extension eagle_kernels._cpu, and the CUDA
extension eagle_kernels._C via CMake.

Metadata lives in pyproject.toml; this file only decides whether and how to build the two
extensions.

``_cpu`` (csrc/cpu/: OpenMP C++, AVX-512 / AVX2 / portable code chosen at run time) is built
with the machine's C++ compiler wherever one exists; it is optional: if it fails to build, the
install goes on without it (the torch backend then runs everything on CPU) and says so.

``_C``:

* built wherever ``nvcc`` is found (``$PATH``, ``$CUDA_HOME/bin``, ``$CUDA_PATH/bin``,
  ``/usr/local/cuda/bin``), with CMake (and Ninja when available) running in parallel;
* skipped, leaving a working pure-Python install, when no nvcc exists or
  ``EAGLE_KERNELS_NO_CUDA=1``;
* ``EAGLE_KERNELS_CUDA_ARCHS`` overrides the architectures (CMake syntax, default "80;90a").

A failing build with nvcc present is an error (set ``EAGLE_KERNELS_NO_CUDA=1`` to skip it).
pip hides build output unless asked: ``pip install -v .`` shows the built/skipped line.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
EXTENSION = "eagle_kernels._C"
CPU_EXTENSION = "eagle_kernels._cpu"
# -ffp-contract=off: only the kernels' explicit FMAs fuse, so every code path rounds alike (the
# row-invariance of csrc/cpu/kernels.h); each isa_*.cpp enables its instruction set itself.
CPU_FLAGS = ["-O3", "-std=c++17", "-fopenmp", "-ffp-contract=off", "-fno-strict-aliasing"]


def _say(message: str) -> None:
    print(f"eagle_kernels: {message}", file=sys.stderr, flush=True)


def _find_nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    for home in filter(None, homes):
        candidate = Path(home) / "bin" / "nvcc"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def _skip_reason(nvcc: str | None) -> str | None:
    if os.environ.get("EAGLE_KERNELS_NO_CUDA", "0") not in ("", "0"):
        return "EAGLE_KERNELS_NO_CUDA is set"
    if nvcc is None:
        return "no nvcc found (PATH, CUDA_HOME, CUDA_PATH, /usr/local/cuda)"
    return None


def _remove_stale_extensions() -> None:
    """A skipped build must not ship or import an old _C: drop it from setuptools' build dirs
    (a pure wheel would pick it up) and, for an editable install, from the source tree."""
    patterns = ["build/lib*/eagle_kernels/_C*.so"]
    if {"editable_wheel", "develop"} & set(sys.argv):
        patterns.append("eagle_kernels/_C*.so")
    for pattern in patterns:
        for path in glob.glob(str(ROOT / pattern)):
            _say(f"removing stale {os.path.relpath(path, ROOT)}")
            os.remove(path)


class CMakeExtension(Extension):
    """An extension whose sources CMakeLists.txt lists (setuptools compiles nothing itself)."""

    def __init__(self, name: str, nvcc: str):
        super().__init__(name, sources=[])
        self.nvcc = nvcc


def _cpu_extension() -> Extension:
    from pybind11.setup_helpers import Pybind11Extension  # a build requirement (pyproject.toml)

    folder = ROOT / "csrc" / "cpu"
    sources = sorted(str(p.relative_to(ROOT)) for p in folder.glob("*.cpp"))
    # The kernels live in headers: without them as depends, an edited .h left a stale build.
    headers = sorted(str(p.relative_to(ROOT)) for p in folder.glob("*.h"))
    return Pybind11Extension(CPU_EXTENSION, sources, depends=headers, include_dirs=["csrc/cpu"],
                             extra_compile_args=CPU_FLAGS, extra_link_args=["-fopenmp"],
                             optional=True)


class CMakeBuild(build_ext):
    """Configure and build CMakeLists.txt so that the module lands where setuptools expects it
    (the build dir; setuptools then copies it into the source tree for editable installs)."""

    def build_extension(self, ext: Extension) -> None:
        if ext.name == CPU_EXTENSION:
            started = time.monotonic()
            try:
                super().build_extension(ext)
            except Exception:
                _say("CPU extension FAILED to build: installing without it (the torch backend "
                     "runs on CPU instead); see the compiler output above")
                raise  # optional=True: setuptools reports and continues
            _say(f"CPU extension BUILT in {time.monotonic() - started:.0f} s")
            return
        if not isinstance(ext, CMakeExtension):
            return super().build_extension(ext)
        cmake = shutil.which("cmake")
        if cmake is None:
            raise RuntimeError("eagle_kernels: nvcc found but no cmake on PATH; install cmake "
                               "(>= 3.24) or set EAGLE_KERNELS_NO_CUDA=1 for a pure-Python "
                               "install")
        target = Path(self.get_ext_fullpath(ext.name)).resolve()
        build_dir = self._cmake_dir()
        build_dir.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        configure = self._configure_args(ext, target)
        self._run([cmake, "-S", str(ROOT), "-B", str(build_dir), *configure])
        self._run([cmake, "--build", str(build_dir), "--parallel", str(self._jobs())])
        if not target.is_file():
            raise RuntimeError(f"eagle_kernels: CMake did not produce {target}")
        _say(f"CUDA extension BUILT: {target.name} in {time.monotonic() - started:.0f} s "
             f"(nvcc {ext.nvcc})")

    def _cmake_dir(self) -> Path:
        """A build dir that survives between installs (editable builds otherwise get a fresh
        temporary one): with ``--no-build-isolation`` rebuilds are then incremental."""
        tag = f"{sysconfig.get_platform()}-{sys.implementation.cache_tag}"
        return ROOT / "build" / f"cmake-{tag}"

    def _configure_args(self, ext: CMakeExtension, target: Path) -> list[str]:
        import pybind11  # a build requirement (pyproject.toml)

        archs = os.environ.get("EAGLE_KERNELS_CUDA_ARCHS", "80;90a")
        args = [
            f"-DCMAKE_CUDA_COMPILER={ext.nvcc}",
            f"-DCMAKE_CUDA_ARCHITECTURES={archs}",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
            f"-DEAGLE_KERNELS_OUTPUT_DIR={target.parent}",
            "-DCMAKE_BUILD_TYPE=" + ("Debug" if self.debug else "Release"),
        ]
        configured = (self._cmake_dir() / "CMakeCache.txt").exists()
        # The venv's ninja (pip install ninja) is not on PATH when pip runs un-activated.
        venv_bin = str(Path(sys.executable).parent)
        ninja = shutil.which("ninja") or shutil.which("ninja", path=venv_bin)
        if ninja and not configured:  # a configured build dir keeps its generator
            args += ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}"]
        _say(f"building the CUDA extension for architectures {archs} "
             f"(EAGLE_KERNELS_CUDA_ARCHS overrides)")
        return args

    @staticmethod
    def _jobs() -> int:
        return int(os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", os.cpu_count() or 1))

    @staticmethod
    def _run(command: list[str]) -> None:
        _say("$ " + " ".join(command))
        try:
            subprocess.run(command, check=True, cwd=ROOT)
        except subprocess.CalledProcessError as error:
            raise RuntimeError("eagle_kernels: building the CUDA extension failed (see the output "
                               "above); set EAGLE_KERNELS_NO_CUDA=1 for a pure-Python install"
                               ) from error


def _extensions() -> list[Extension]:
    nvcc = _find_nvcc()
    reason = _skip_reason(nvcc)
    if reason is not None:
        _say(f"CUDA extension SKIPPED: {reason}; installing pure Python (torch/triton backends)")
        _remove_stale_extensions()
        return [_cpu_extension()]
    _say(f"CUDA extension will be built with {nvcc} (Python {sysconfig.get_python_version()})")
    return [_cpu_extension(), CMakeExtension(EXTENSION, nvcc)]


setup(ext_modules=_extensions(), cmdclass={"build_ext": CMakeBuild})
