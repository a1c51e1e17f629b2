"""Builds pycollectives._C with torch.utils.cpp_extension.

With a CUDA build of torch and a CUDA toolkit (CUDA_HOME, else /usr/local/cuda
when nvcc is there) the extension includes the CUDA engine; otherwise it is
CPU-only. PYCOLL_FORCE_CPU=1 forces the CPU-only build. Either way it prints
which one it built.
"""
import glob
import os
import shutil
import subprocess
import sys

from setuptools import find_packages, setup


def _find_cuda_home():
    if os.environ.get("CUDA_HOME") and os.path.exists(os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc")):
        return os.environ["CUDA_HOME"]
    if os.path.exists("/usr/local/cuda/bin/nvcc"):
        return "/usr/local/cuda"
    nvcc = shutil.which("nvcc")
    return os.path.dirname(os.path.dirname(nvcc)) if nvcc else None


def _want_cuda():
    if os.environ.get("PYCOLL_FORCE_CPU", "0") == "1":
        return False, "PYCOLL_FORCE_CPU=1"
    import torch  # noqa: WPS433 (build-time import)

    if torch.version.cuda is None:
        return False, "torch has no CUDA"
    home = _find_cuda_home()
    if home is None:
        return False, "no CUDA toolkit found (set CUDA_HOME)"
    # torch.utils.cpp_extension reads CUDA_HOME when it is imported.
    os.environ["CUDA_HOME"] = home
    return True, f"CUDA {torch.version.cuda}, toolkit at {home}"


def _gcc_major(cxx):
    try:
        out = subprocess.run([cxx, "-dumpversion"], capture_output=True, text=True, timeout=30).stdout.strip()
        return int(out.split(".")[0])
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def _links_shared_libstdcxx(cxx):
    try:
        out = subprocess.run([cxx, "-print-file-name=libstdc++.so"], capture_output=True, text=True,
                             timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return False
    return os.path.isabs(out) and os.path.exists(out)


def _pick_compiler():
    """Keeps CXX unless it would put a second C++ runtime into the process.

    A compiler that links libstdc++ statically into shared objects, or whose
    headers are from another GCC than torch's, makes an extension whose
    iostreams use facets of the other runtime: seen as a segfault in the
    first `ostream << int` (a device image sets CXX=/opt/gcc/bin/g++). Then
    the g++ on PATH is used when it matches torch's GCC.
    """
    import re

    import torch

    cxx = os.environ.get("CXX")
    if not cxx:
        return
    m = re.search(r"GCC (\d+)\.", torch.__config__.show())
    torch_major = int(m.group(1)) if m else None
    bad = []
    if not _links_shared_libstdcxx(cxx):
        bad.append("links libstdc++ statically")
    if torch_major and _gcc_major(cxx) not in (None, torch_major):
        bad.append(f"is GCC {_gcc_major(cxx)}, torch was built with GCC {torch_major}")
    if not bad:
        return
    for name in ("g++", f"g++-{torch_major}"):
        alt = shutil.which(name, path="/usr/bin:/usr/local/bin")
        if alt and os.path.realpath(alt) != os.path.realpath(cxx) and _links_shared_libstdcxx(alt) \
                and _gcc_major(alt) in (None, torch_major):
            print(f"pycollectives: CXX={cxx} {' and '.join(bad)}; using {alt} instead", file=sys.stderr)
            os.environ["CXX"] = alt
            cc = os.path.join(os.path.dirname(alt), "gcc" + name[3:])
            if os.path.exists(cc):
                os.environ["CC"] = cc
            return
    if not _links_shared_libstdcxx(cxx):  # an older GCC alone is fine (tested with GCC 12 against torch's 13)
        print(f"pycollectives: warning: CXX={cxx} {' and '.join(bad)}; the extension may crash", file=sys.stderr)


# C++ that needs the CUDA engine (its .cu files) and a CUDA build of torch: the CUDA tensor engine
# and the backend's device queue with its events and their watcher. A CPU-only build leaves them out and has
# csrc/backend/no_cuda.cpp in their place.
_CUDA_ONLY_CPP = [os.path.join("csrc", *p.split("/")) for p in (
    "engines/cuda_tensor_engine.cpp", "backend/cuda_ops.cpp", "backend/cuda_event_pool.cpp",
    "backend/cuda_op_watcher.cpp", "backend/flight_recorder_cuda_bench.cpp")]


def _extension():
    _pick_compiler()
    use_cuda, why = _want_cuda()
    from torch.utils import cpp_extension

    here = os.path.dirname(os.path.abspath(__file__))
    sources = sorted(glob.glob(os.path.join("csrc", "**", "*.cpp"), recursive=True))
    # -ffp-contract=off: the CPU reduction loops are also compiled for FMA-capable levels
    # (csrc/cpu/kernels/reduce.cpp); fusing there would change results between CPUs.
    cxx = ["-O3", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-deprecated-declarations",
           "-Wno-missing-field-initializers", "-ffp-contract=off"]
    macros = []
    if use_cuda:
        # Minimal toolkits (nvcc only) lack the math-library headers that
        # ATen/cuda includes; torch's wheels ship them. Searched last.
        import torch

        site = os.path.dirname(os.path.dirname(torch.__file__))
        after = []
        for inc in sorted(glob.glob(os.path.join(site, "nvidia", "*", "include"))):
            cxx += ["-idirafter", inc]
            after += ["-Xcompiler", "-idirafter", "-Xcompiler", inc]
        sources += sorted(glob.glob(os.path.join("csrc", "**", "*.cu"), recursive=True))
        macros.append(("PYCOLL_WITH_CUDA", "1"))
        nvcc = ["-O3", "--expt-relaxed-constexpr", "-Xcompiler", "-Wall",
                "-Xcompiler", "-Wno-unused-parameter", "-Xcompiler", "-Wno-deprecated-declarations",
                "-DPYCOLL_WITH_CUDA=1"] + after
        os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
        ext = cpp_extension.CUDAExtension(
            "pycollectives._C", sources, include_dirs=[os.path.join(here, "csrc")],
            define_macros=macros, extra_compile_args={"cxx": cxx, "nvcc": nvcc},
        )
    else:
        # csrc/cuda/*.cpp is the CUDA engine's plain C++ (its settings, limits, plans and choices;
        # everything CUDA there is in .cu files): kept, so that it is testable without a GPU.
        sources = [s for s in sources if s not in _CUDA_ONLY_CPP]
        ext = cpp_extension.CppExtension(
            "pycollectives._C", sources, include_dirs=[os.path.join(here, "csrc")],
            define_macros=macros, extra_compile_args={"cxx": cxx},
        )
    print(f"pycollectives: building the {'CUDA' if use_cuda else 'CPU-only'} extension ({why})", file=sys.stderr)
    return ext, cpp_extension.BuildExtension.with_options(use_ninja=shutil.which("ninja") is not None)


ext, build_ext = _extension()

setup(
    name="pycollectives",
    version="0.1.0",
    description="A collective-communication backend for torch.distributed (CPU shared memory, CUDA NVLink)",
    packages=find_packages(include=["pycollectives", "pycollectives.*"]),
    package_data={"pycollectives": ["cost_model*.json"]},
    ext_modules=[ext],
    cmdclass={"build_ext": build_ext},
    entry_points={"console_scripts": ["pycoll-bench=pycollectives.bench.cli:main",
                                      "pycoll-sim=pycollectives.schedule.simulate:main",
                                      "pycoll-trace=pycollectives.trace.cli:main",
                                      "pycoll-cluster=pycollectives.cluster.cli:main"]},
    python_requires=">=3.9",
)
