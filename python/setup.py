"""Builds polyprobe's Python package with the project's CMake (see pyproject.toml).

The C++ project (one folder up) is configured and built (tests off), and its install
component `python_wheel` is staged: polyprobe/_core*.so, polyprobe/lib/libpolyprobe.so* and
polyprobe/plugins/, so the installed package finds its own core and plugins.
Environment: POLYPROBE_BUILD_DIR (an already built tree, e.g. `build`: staged as it is,
nothing compiled), POLYPROBE_CMAKE_ARGS (extra configure arguments),
CMAKE_BUILD_PARALLEL_LEVEL."""
import os
import pathlib
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent


class CMakeBuild(build_ext):
    def build_extension(self, ext: Extension) -> None:
        stage = pathlib.Path(self.build_temp).resolve() / "stage"
        given = os.environ.get("POLYPROBE_BUILD_DIR")
        if given:
            build = (ROOT / given).resolve()
        else:
            build = pathlib.Path(self.build_temp).resolve() / "cmake"
            configure = ["cmake", "-S", str(ROOT), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                         "-DPOLYPROBE_BUILD_TESTS=OFF", "-DPOLYPROBE_PYTHON=ON",
                         f"-DPython_EXECUTABLE={sys.executable}"]
            if shutil.which("ninja"):
                configure += ["-G", "Ninja"]
            configure += os.environ.get("POLYPROBE_CMAKE_ARGS", "").split()
            subprocess.run(configure, check=True)
            subprocess.run(["cmake", "--build", str(build)], check=True)
        if stage.exists():
            shutil.rmtree(stage)
        subprocess.run(["cmake", "--install", str(build), "--prefix", str(stage),
                        "--component", "python_wheel"], check=True)
        out = pathlib.Path(self.get_ext_fullpath(ext.name)).parent  # <build_lib>/polyprobe
        out.mkdir(parents=True, exist_ok=True)
        for item in (stage / "polyprobe").iterdir():
            target = out / item.name
            if item.is_dir():
                shutil.copytree(item, target, symlinks=True, dirs_exist_ok=True)
            else:
                shutil.copy2(item, target, follow_symlinks=False)


setup(
    packages=["polyprobe"],
    package_dir={"polyprobe": "polyprobe"},
    package_data={"polyprobe": ["*.pyi", "py.typed"]},
    ext_modules=[Extension("polyprobe._core", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    zip_safe=False,
)
