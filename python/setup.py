"""Packaging of zerort: the pure-Python package plus the libzerort.so it loads.

The version is the library's (the project() line of the top-level CMakeLists.txt). The
library is copied from ZERORT_LIBRARY, or else from build/lib/libzerort.so of this source
tree; the build fails, naming both, when neither exists. The wheel is platform-specific:
libzerort.so links the system's libraries it was built against (abseil, OpenMPI, CUDA).
"""
import os
import re
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_ROOT = os.path.dirname(HERE)


def library_version():
    """The project version from CMakeLists.txt, e.g. "0.1.0"."""
    with open(os.path.join(SOURCE_ROOT, "CMakeLists.txt"), encoding="utf-8") as cmake:
        match = re.search(r"project\(ZeroRT VERSION ([0-9.]+)", cmake.read())
    if match is None:
        raise RuntimeError("no 'project(ZeroRT VERSION x.y.z' line in CMakeLists.txt")
    return match.group(1)


def built_library():
    """Path of the libzerort.so to package."""
    candidates = [os.environ.get("ZERORT_LIBRARY", ""),
                  os.path.join(SOURCE_ROOT, "build", "lib", "libzerort.so")]
    for path in candidates:
        if path and os.path.isfile(path):
            return path
    raise RuntimeError("libzerort.so not found: build the library first (make), or set "
                       "ZERORT_LIBRARY to its path. Tried: "
                       + ", ".join(p for p in candidates if p))


class BuildWithLibrary(build_py):
    """build_py that also puts libzerort.so inside the package."""

    def run(self):
        super().run()
        target = os.path.join(self.build_lib, "zerort", "libzerort.so")
        shutil.copyfile(built_library(), target)


class PlatformDistribution(Distribution):
    """Marks the wheel as platform-specific: it carries a shared library."""

    def has_ext_modules(self):
        return True


setup(
    version=library_version(),
    packages=["zerort", "zerort.torch", "zerort.torch.deepspeed",
              "zerort.torch.deepspeed.utils"],
    cmdclass={"build_py": BuildWithLibrary},
    distclass=PlatformDistribution,
)
