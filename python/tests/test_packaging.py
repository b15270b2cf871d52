"""`pip install ./python` without a network: the wheel carries libzerort.so, and the
installed package imports and runs from anywhere, without the source tree or
ZERORT_LIBRARY."""
import glob
import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE_ROOT = os.path.dirname(PYTHON_DIR)

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("pip", "setuptools", "wheel")),
    reason="needs pip, setuptools and wheel (python3-pip, python3-setuptools, python3-wheel)")


def _library_version():
    with open(os.path.join(SOURCE_ROOT, "CMakeLists.txt"), encoding="utf-8") as cmake:
        for line in cmake:
            if line.startswith("project(ZeroRT VERSION "):
                return line.split()[2]
    raise AssertionError("no project() line in CMakeLists.txt")


def _pip(*args, cwd):
    subprocess.run([sys.executable, "-m", "pip", *args, "--no-index", "--no-deps", "-q",
                    "--disable-pip-version-check"], check=True, cwd=cwd)


def test_wheel_installs_and_runs_outside_the_source_tree(tmp_path):
    library = os.environ.get("ZERORT_LIBRARY")
    if not library or not os.path.isfile(library):
        pytest.skip("ZERORT_LIBRARY must name the built library (CTest sets it)")
    # A copy of the package sources beside the CMakeLists.txt that names the version, so
    # the build writes nothing into the repository.
    source = tmp_path / "source"
    shutil.copytree(PYTHON_DIR, source / "python",
                    ignore=shutil.ignore_patterns("__pycache__", "tests"))
    shutil.copy(os.path.join(SOURCE_ROOT, "CMakeLists.txt"), source / "CMakeLists.txt")
    _pip("wheel", "--no-build-isolation", "-w", str(tmp_path / "dist"), str(source / "python"),
         cwd=tmp_path)
    wheels = glob.glob(str(tmp_path / "dist" / "zerort-*.whl"))
    assert len(wheels) == 1, wheels
    name = os.path.basename(wheels[0])
    assert name.startswith(f"zerort-{_library_version()}-"), name
    assert not name.endswith("-none-any.whl"), f"{name}: it carries a shared library"
    _pip("install", "--root-user-action=ignore", "--target", str(tmp_path / "site"), wheels[0],
         cwd=tmp_path)

    probe = ("import os, zerort, zerort.core as core\n"
             "comms = zerort.local_group(1)\n"
             "print(os.path.realpath(core.library()._name))\n"
             "print(zerort.version())\n"
             "try:\n"
             "    import torch\n"
             "except ImportError:\n"
             "    print('no torch')\n"
             "else:\n"
             "    import zerort.torch\n"
             "    from zerort.torch.deepspeed import initialize  # the subpackages too\n"
             "    from zerort.torch.deepspeed.utils.zero_to_fp32 import main\n"
             "    print(os.path.realpath(zerort.torch.__file__))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("ZERORT_LIBRARY", "PYTHONPATH")}
    env["PYTHONPATH"] = str(tmp_path / "site")
    result = subprocess.run([sys.executable, "-c", probe], check=True, cwd=tmp_path, env=env,
                            capture_output=True, text=True)
    loaded, version, torch_package = result.stdout.splitlines()
    assert version.startswith(f"ZeroRT {_library_version()} "), version
    assert loaded == os.path.realpath(tmp_path / "site" / "zerort" / "libzerort.so")
    if torch_package != "no torch":  # the PyTorch integration is a subpackage, installed too
        assert torch_package == os.path.realpath(
            tmp_path / "site" / "zerort" / "torch" / "__init__.py")


def test_building_without_a_library_names_what_to_do(tmp_path):
    source = tmp_path / "source"
    shutil.copytree(PYTHON_DIR, source / "python",
                    ignore=shutil.ignore_patterns("__pycache__", "tests"))
    shutil.copy(os.path.join(SOURCE_ROOT, "CMakeLists.txt"), source / "CMakeLists.txt")
    env = {k: v for k, v in os.environ.items() if k != "ZERORT_LIBRARY"}
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-index", "--no-deps",
         "-w", str(tmp_path / "dist"), str(source / "python")],
        cwd=tmp_path, env=env, capture_output=True, text=True)
    assert result.returncode != 0
    assert "build the library first" in result.stdout + result.stderr
