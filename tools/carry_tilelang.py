"""Pack TileLang (and what it needs beside the GPU machine's own packages) into one archive to carry.

    python tools/carry_tilelang.py [--out carry/tilelang.tar.xz] [--pythons 3.12 3.11] [--no-kernels] [--verify]
                                   [--fib | --flashinfer | --nbgrader]

The GPU machine (Python 3.12, PyTorch 2.11, CUDA 13.0 with nvcc) can install nothing from a registry
and takes at most 64 MiB of carried files; TileLang's wheels with their needs are about 82 MB. This
builds ``carry/tilelang.tar.xz`` (git-ignored), well under 50 MB, which unpacks to:

    site/    tilelang 0.1.15, apache-tvm-ffi 0.1.12, z3-solver's libz3 (one copy: libz3.so.4.15, the
             name libtvm_compiler.so loads, and libz3.so, the name z3's Python module loads, as a
             link to it), cloudpickle; apache-tvm-ffi's compiled core for every Python in --pythons
             (default 3.12, the GPU machine's, and this interpreter's), so the same folder imports here
             and there. Left out: z3's command-line binary and headers, __pycache__, torch-c-dlpack-ext
             (PyTorch >= 2.10 exchanges DLPack natively), packages the GPU machine has (numpy, psutil,
             tqdm, typing-extensions, ml-dtypes).
    cache/   TileLang's kernel cache with every kernel gpu_try.py runs (tilelang_fa.planned_kernels),
             built here for sm_90a by TileLang with this machine's nvcc. The cache key is the program,
             target, pass configs and TileLang's own libraries, not the machine, so the GPU machine
             loads them instead of compiling (where a key misses, TileLang compiles there as usual).

With --fib it packs FlashInfer-Bench 0.1.2 and the packages it imports that the GPU machine lacks
(pydantic with its compiled core for each Python, annotated-types, typing-inspection, docstring-parser)
into ``carry/fib.tar.xz`` (about 3 MiB), for step 11's traces (benchmarks/ladder.py 11 --traces); it
unpacks into the same folder as the TileLang archive (both hold a site/).

With --flashinfer it packs FlashInfer's prefill kernel, the bench's extra reference backend "FLASHINFER"
(facourse.bench.flashinfer_reference), into ``carry/flashinfer.tar.xz`` (7.5 MiB; it too unpacks into
the TileLang archive's folder and uses its apache-tvm-ffi): flashinfer-python 0.7.2.post1's Python files,
the prefill templates its module generator reads, and its two single-prefill modules for fp16 and head
dim 128 (the graded perf configurations), FA2 and FA3, built here for sm_90a with this machine's nvcc
(63 s and 320 s on 2 cores, 2026-11-23; kept in ~/.cache/facourse-carry/flashinfer-aot for the next run)
into flashinfer/data/aot/, where FlashInfer loads a module without building it. Left out: the kernels'
sources and headers (CUTLASS, CCCL: about 330 MB), which only a build needs.

With --nbgrader it packs the grading side (``python -m autograder autograde`` on the GPU machine, which
has no Jupyter stack) into ``carry/nbgrader.tar.xz`` (about 9 MiB), unpacked into its own folder:

    site/    nbgrader 0.9.6 and what it, nbconvert/nbclient, jupyter_client, ipykernel (the grading
             kernel), jupyter_server (nbgrader imports it), pyzmq, tornado, SQLAlchemy and alembic need
             that the GPU machine lacks (NBG_PINS: the versions of the course's environment, so grading
             behaves as in CI); the compiled ones (pyzmq, SQLAlchemy, rpds-py, RapidFuzz) for every
             Python in --pythons. Left out: the packages the GPU image has (IMAGE_HAS: jinja2,
             markupsafe, pygments, pyyaml, python-dateutil, packaging, requests, psutil, ...), debugpy
             and jedi (ipykernel and IPython import them only when present), and nbgrader's docs and
             tests and the web assets of nbgrader's formgrader, notebook and jupyter_server.
    bin/     ``alembic``: nbgrader runs it (the gradebook's schema version) from PATH.
    share/   jupyter/kernels/python3: the kernelspec (``python3 -m ipykernel_launcher``), on JUPYTER_PATH.
             (Without it jupyter_client would still find ipykernel's own, for the interpreter that runs.)

The wheels come from PyPI with pip (``pip download --only-binary=:all: --python-version ...``, into
~/.cache/facourse-carry/wheels): the same files pip would install on each Python. It prints the
line that unpacks the archive on the GPU machine; with --verify it unpacks the archive into a
temporary folder and, with only that folder (and src/) on PYTHONPATH, imports tilelang, lowers the
kernel for sm_90a and builds one kernel with nvcc, then loads a carried kernel from the cache.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LADDER = ROOT / "solutions" / "11_interchangeable_kernels" / "ladder"
PINS = ["tilelang==0.1.15", "apache-tvm-ffi==0.1.12", "z3-solver==4.15.4.0", "cloudpickle==3.1.2"]
# --fib: FlashInfer-Bench (step 11's traces and apply()) and what it imports that the GPU machine lacks
# (it has torch, safetensors and typing-extensions), as course.sh installs it: without flashinfer-python.
FIB_PINS = ["flashinfer-bench==0.1.2", "pydantic==2.14.3", "pydantic-core==2.50.4", "annotated-types==0.8.0",
            "typing-inspection==0.4.5", "docstring-parser==0.18.0"]
# --flashinfer: the package (its Python files only go in), and what building its modules needs here:
# importing it (nvidia-ml-py; the GPU machine has it, and apache-tvm-ffi comes with the TileLang archive)
# and cuRAND's headers, which CUTLASS's utilities include in the FA3 kernel (this toolkit has none)
FI_PINS = ["flashinfer-python==0.7.2.post1"]
FI_BUILD_PINS = ["nvidia-ml-py==13.615.71", "apache-tvm-ffi==0.1.12", "nvidia-curand==10.4.0.35"]
FI_BACKENDS = ("fa2", "fa3")                 # single prefill, fp16, head dim 128
FI_KEEP_CSRC = ("*prefill*", "tvm_ffi_utils.h")
FI_AOT = Path(os.environ.get("FACOURSE_FI_AOT", Path.home() / ".cache" / "facourse-carry" / "flashinfer-aot"))
# --nbgrader: nbgrader and what grading imports (the trace of an autograde run: the nbgrader process,
# the release and the kernel) that the GPU image lacks, at the versions of the course's environment
# (.venv, pyproject's dev extra); jsonschema's optional format checkers (fqdn ... webcolors) and the
# pure-Python parts of jupyter_server's needs go too, small, so nothing imports differently than in CI.
NBG_PINS = [
    "nbgrader==0.9.6", "nbclient==0.11.0", "nbconvert==7.17.2", "nbformat==5.11.1", "jupyter-client==8.10.0",
    "jupyter-core==5.9.1", "jupyter-server==2.21.1", "notebook==7.6.5", "notebook-shim==0.2.4",
    "ipykernel==7.4.0", "ipython==9.18.1", "ipython-pygments-lexers==1.1.1", "traitlets==5.16.1",
    "pyzmq==27.3.0", "tornado==6.6.1", "sqlalchemy==2.1.9", "alembic==1.20.1", "mako==1.4.3",
    "rapidfuzz==3.14.6", "comm==0.2.3", "matplotlib-inline==0.2.2", "nest-asyncio2==1.7.4",
    "prompt-toolkit==3.0.53", "wcwidth==0.9.4", "pexpect==4.9.0", "ptyprocess==0.7.0", "stack-data==0.6.3",
    "executing==2.3.0", "asttokens==3.0.2", "pure-eval==0.2.4", "platformdirs==4.14.7",
    "fastjsonschema==2.22.3", "jsonschema==4.26.0", "jsonschema-specifications==2025.9.1",
    "referencing==0.37.0", "rpds-py==2026.9.1", "bleach==6.4.0", "tinycss2==1.5.1", "webencodings==0.6.1",
    "defusedxml==0.7.1", "mistune==3.4.0", "pandocfilters==1.5.1", "jupyterlab-pygments==0.3.0",
    "beautifulsoup4==4.15.0", "soupsieve==4.1.2", "arrow==1.4.0", "tzdata==2026.6", "fqdn==1.6.0",
    "isoduration==20.11.0", "jsonpointer==3.12", "lark==1.3.1", "rfc3339-validator==0.1.4",
    "rfc3986-validator==0.1.1", "rfc3987-syntax==1.1.0", "uri-template==1.3.0", "webcolors==25.10.0",
    "jupyter-events==0.12.1", "python-json-logger==4.2.0", "overrides==7.7.0", "send2trash==2.2.0",
    "terminado==0.18.1", "jupyter-server-terminals==0.5.4", "websocket-client==1.9.2",
]
# What the GPU image already has (/work/.library/device/KINDS.md, "Python packages already there",
# 2026-11-17): never carried; the closure check below counts them as present.
IMAGE_HAS = set("""absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx humanize
hypothesis idna imageio iniconfig interface-meta jax jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning
lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson
ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba
numba-cuda numpy numpyro nvidia-ml-py onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum
opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker
prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks
pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil
pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy
seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels sympy
tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch
torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton typer
typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp""".split())
# Optional at import, and large: ipykernel's debugger (debugpy), IPython's completer (jedi, parso);
# argon2-cffi (jupyter_server's password hashing, never called when grading).
# Declared by nbgrader and notebook, never imported by grading: JupyterLab and the formgrader's UI.
NBG_OPTIONAL = {"debugpy", "jedi", "parso", "argon2-cffi", "argon2-cffi-bindings", "cffi", "pycparser",
                "jupyterlab", "jupyterlab-server", "jupyter-builder", "ipywidgets"}
NBG_PRUNE_PATHS = ["nbgrader/docs", "nbgrader/tests", "nbgrader/labextension", "nbgrader/nbextensions",
                   "nbgrader/server_extensions/formgrader/static", "notebook/static", "notebook/labextension",
                   "jupyter_server/static", "IPython/testing/plugin", "tornado/test", "zmq/tests",
                   "sqlalchemy/testing", "rapidfuzz/__pyinstaller"]
NBG_VERSION_SPECIFIC = ("pyzmq", "sqlalchemy", "rpds_py", "rapidfuzz")
KERNEL_JSON = {"argv": ["python3", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
               "display_name": "Python 3 (ipykernel)", "language": "python", "metadata": {"debugger": False}}
VERSION_SPECIFIC = ("apache_tvm_ffi", "pydantic_core")   # the wheels here with a per-Python compiled module
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64"]
WHEELS = Path(os.environ.get("FACOURSE_WHEELS", Path.home() / ".cache" / "facourse-carry" / "wheels"))
PRUNE_DIRS = {"__pycache__"}
PRUNE_PATHS = ["bin", "z3/include"]   # (tvm_ffi.core links libtvm_ffi_testing.so: kept)
LIMIT_MB = 50


def device_prefix(archive: str = "carry/tilelang.tar.xz") -> str:
    """The shell line that unpacks the archive on the GPU machine, ahead of the command proper."""
    return (f"mkdir -p /tmp/tl && tar xJf {archive} -C /tmp/tl && "
            "export PYTHONPATH=/tmp/tl/site:src:. TILELANG_CACHE_DIR=/tmp/tl/cache &&")


def download(py: str, pins: list[str]) -> list[Path]:
    """The wheels of ``pins`` for CPython ``py`` (e.g. "3.12") on x86-64 Linux, from PyPI, cached."""
    dest = WHEELS / f"cp{py.replace('.', '')}"
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-q", "--no-deps",
           "--only-binary=:all:", "--python-version", py, "--implementation", "cp", "-d", str(dest)]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    subprocess.run(cmd + pins, check=True)
    want = {p.split("==")[0].replace("-", "_").lower(): p.split("==")[1] for p in pins}
    wheels = [w for w in sorted(dest.glob("*.whl"))
              if want.get(w.name.split("-")[0].lower()) == w.name.split("-")[1]]
    missing = set(want) - {w.name.split("-")[0].lower() for w in wheels}
    if missing:
        raise SystemExit(f"no wheel for {sorted(missing)} on Python {py}")
    return wheels


def unpack_wheel(whl: Path, site: Path, only_version_specific: bool = False) -> None:
    """A wheel's files into ``site`` as pip lays them out (.data/purelib|platlib at the top; scripts,
    headers and data left out)."""
    with zipfile.ZipFile(whl) as z:
        for info in z.infolist():
            name = info.filename
            parts = name.split("/")
            if parts[0].endswith(".data"):
                if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                    continue
                name = "/".join(parts[2:])
            if only_version_specific and "cpython-3" not in name and not parts[0].endswith(".libs"):
                continue
            if name.endswith("/"):
                continue
            target = site / name
            target.parent.mkdir(parents=True, exist_ok=True)
            with z.open(info) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
            mode = (info.external_attr >> 16) & 0o777
            if mode:
                target.chmod(mode)


def prune(site: Path) -> None:
    for d in [p for p in site.rglob("*") if p.is_dir() and p.name in PRUNE_DIRS]:
        shutil.rmtree(d, ignore_errors=True)
    for rel in PRUNE_PATHS:
        p = site / rel
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
    lib = site / "z3" / "lib"                    # one libz3: the soname file, and z3.py's name linked to it
    sonames = sorted(lib.glob("libz3.so.*"))
    if sonames and (lib / "libz3.so").exists():
        (lib / "libz3.so").unlink()
        (lib / "libz3.so").symlink_to(sonames[0].name)


def build_kernels(site: Path, cache: Path) -> None:
    """Every kernel gpu_try.py uses, compiled for sm_90a into ``cache`` (needs nvcc), in a subprocess
    that sees only ``site`` (and src/) for tilelang."""
    code = f"""
import concurrent.futures as cf, sys, time
sys.path[:0] = [{str(LADDER)!r}]
import tilelang_fa as fa
ks = fa.planned_kernels(sweep=True)
t0 = time.time()
with cf.ThreadPoolExecutor(2) as ex:
    list(ex.map(lambda k: fa.compile_kernel(*k), ks))
print(f"built {{len(ks)}} kernels for sm_90a in {{time.time() - t0:.0f}} s")
"""
    env = clean_env(site, cache)
    subprocess.run([sys.executable, "-c", code], env=env, check=True)


def build_flashinfer(site: Path, work: Path) -> None:
    """FlashInfer's Python files into ``site`` with its single-prefill modules in data/aot/, built here
    for sm_90a (or taken from FI_AOT, where each build is kept)."""
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    full = work / "flashinfer_full"
    for whl in download("3.12", FI_PINS) + download(here, FI_BUILD_PINS):
        unpack_wheel(whl, full)
    version = FI_PINS[0].split("==")[1]
    code = f"""
import shutil, sys, time, torch
from pathlib import Path
from flashinfer.jit.attention.modules import gen_single_prefill_module
f16 = torch.float16
for backend in {FI_BACKENDS!r}:
    spec = gen_single_prefill_module(backend, f16, f16, f16, 128, 128, 0, False, False, False)
    kept = Path({str(FI_AOT / version)!r}) / spec.name / (spec.name + ".so")
    if not kept.exists():
        t0 = time.time()
        spec.build(verbose=False)
        kept.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(spec.jit_library_path, kept)
        print(f"built {{spec.name}} for sm_90a in {{time.time() - t0:.0f}} s", flush=True)
    dest = Path({str(site / "flashinfer" / "data" / "aot")!r}) / spec.name / (spec.name + ".so")
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(kept, dest)
"""
    # FlashInfer links with -lcudart -lcuda from CUDA_HOME's lib64 (and lib64/stubs): CUDA_HOME is the
    # toolkit of the nvcc that runs (not the folder of a wrapper script on PATH), and an empty libcuda.so
    # stands in for the driver's (the module loads libcuda through libcudart, not by link)
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise SystemExit("--flashinfer builds FlashInfer's modules with nvcc: none here")
    toolkit = os.environ.get("CUDA_HOME") or subprocess.run(
        ["sh", "-c", "nvcc -v -x cu -E /dev/null -o /dev/null 2>&1 | sed -n 's/^#\\$ TOP=//p'"],
        capture_output=True, text=True).stdout.strip() or str(Path(nvcc).resolve().parent.parent)
    stubs = work / "stubs"
    stubs.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cc", "-shared", "-o", str(stubs / "libcuda.so"), "-x", "c", "/dev/null"], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "FLASHINFER", "TVM"))}
    env.update(PYTHONPATH=str(full), FLASHINFER_CUDA_ARCH_LIST="9.0a", FLASHINFER_WORKSPACE_BASE=str(work / "ws"),
               CUDA_HOME=str(Path(toolkit).resolve()), FLASHINFER_EXTRA_LDFLAGS=f"-L{stubs}",
               FLASHINFER_EXTRA_CUDAFLAGS=f"-I{full / 'nvidia' / 'cu13' / 'include'}",
               MAX_JOBS="2", OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", PYTHONDONTWRITEBYTECODE="1")
    (site / "flashinfer").mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    src = full / "flashinfer"
    for f in src.rglob("*"):
        rel = f.relative_to(src)
        if f.is_dir() or "__pycache__" in rel.parts:
            continue
        if rel.parts[0] == "data" and not (len(rel.parts) == 3 and rel.parts[1] == "csrc"
                                           and any(f.match(g) for g in FI_KEEP_CSRC)):
            continue
        (site / "flashinfer" / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, site / "flashinfer" / rel)


def clean_env(site: Path, cache: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "TILELANG", "TVM"))}
    env.update(PYTHONPATH=os.pathsep.join([str(site), str(ROOT / "src")]), TILELANG_CACHE_DIR=str(cache),
               OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="",
               PYTHONDONTWRITEBYTECODE="1")
    return env


def pack(stage: Path, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    xz = shutil.which("xz")
    if xz and shutil.which("tar"):
        with open(tmp, "wb") as f:
            tar = subprocess.Popen(["tar", "-C", str(stage), "-cf", "-", "--owner=0", "--group=0", "--sort=name",
                                    *[n for n in ("site", "cache", "bin", "share") if (stage / n).exists()]],
                                   stdout=subprocess.PIPE)
            subprocess.run([xz, "-9e", "-T2", "-c"], stdin=tar.stdout, stdout=f, check=True)
            if tar.wait() != 0:
                raise SystemExit("tar failed")
    else:
        import tarfile
        with tarfile.open(tmp, "w:xz", preset=9) as t:
            for name in ("site", "cache", "bin", "share"):
                if (stage / name).exists():
                    t.add(stage / name, arcname=name)
    tmp.replace(out)


def verify(out: Path) -> None:
    """Unpack into a temporary folder and use only it: import, lower for sm_90a, build, load from cache."""
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        subprocess.run(["tar", "xJf", str(out), "-C", str(d)], check=True)
        fresh = d / "fresh_cache"
        code = f"""
import os, sys, time
sys.path[:0] = [{str(LADDER)!r}]
t0 = time.time(); import tilelang; t1 = time.time()
assert tilelang.__file__.startswith({str(d)!r}), tilelang.__file__
import tilelang_fa as fa
src = fa.hopper_source("float16", 128, True)
assert "tl::wgmma_ss<" in src and "tl::tma_load(" in src, "not Hopper code"
t2 = time.time()
k = fa.compile_kernel("float16", 128, True, fa.TILES[128]); t3 = time.time()
os.environ["TILELANG_CACHE_DIR"] = {str(fresh)!r}
fa.compile_kernel.cache_clear()
k = fa.compile_kernel("bfloat16", 64, False, fa.TILES[64]); t4 = time.time()
print(f"verified: import tilelang {{t1 - t0:.1f}} s (from {{os.path.dirname(tilelang.__file__)}}), "
      f"sm_90a lowering {{t2 - t1:.1f}} s, a carried kernel loaded in {{t3 - t2:.2f}} s, "
      f"a fresh build with nvcc {{t4 - t3:.1f}} s")
"""
        subprocess.run([sys.executable, "-c", code], env=clean_env(d / "site", d / "cache"), check=True)


# ----------------------------------------------------------------------------- --nbgrader
NBG_DIR = "/tmp/nbg"


def nbgrader_prefix(archive: str = "carry/nbgrader.tar.xz", where: str = NBG_DIR) -> str:
    """The shell line that unpacks the grading archive on the GPU machine, ahead of the command proper."""
    # absolute paths: the grading kernel runs in the submission's folder, where src:. would name nothing
    return (f"mkdir -p {where} && tar xJf {archive} -C {where} && export PYTHONPATH={where}/site:$PWD/src:$PWD "
            f"JUPYTER_PATH={where}/share/jupyter PATH={where}/bin:$PATH &&")


def _canon(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def build_nbgrader(stage: Path, pythons: list[str]) -> None:
    """NBG_PINS into ``stage/site`` (the compiled ones for every Python of ``pythons``), pruned; the
    alembic command into ``stage/bin`` and the kernelspec into ``stage/share``; then the closure check:
    every carried package's needs are carried, on the GPU image, or optional (NBG_OPTIONAL)."""
    import json
    site = stage / "site"
    for i, py in enumerate(pythons):
        pins = NBG_PINS if i == 0 else [p for p in NBG_PINS if _canon(p.split("==")[0]).replace("-", "_")
                                        in NBG_VERSION_SPECIFIC]
        for whl in download(py, pins):
            unpack_wheel(whl, site, only_version_specific=i > 0)
    prune(site)
    for rel in NBG_PRUNE_PATHS:
        shutil.rmtree(site / rel, ignore_errors=True)
    (stage / "bin").mkdir(parents=True, exist_ok=True)
    alembic = stage / "bin" / "alembic"
    alembic.write_text("#!/usr/bin/env python3\nimport sys\nfrom alembic.config import main\nsys.exit(main())\n")
    alembic.chmod(0o755)
    spec = stage / "share" / "jupyter" / "kernels" / "python3"
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(json.dumps(KERNEL_JSON, indent=1) + "\n")
    for logo in ("logo-32x32.png", "logo-64x64.png", "logo-svg.svg"):
        src = site / "ipykernel" / "resources" / logo
        if src.exists():
            shutil.copyfile(src, spec / logo)
    # the closure: Requires-Dist of every carried distribution (no extras), against what is carried
    import email.parser

    from packaging.requirements import Requirement
    carried, needs = set(), {}
    for meta in site.glob("*.dist-info/METADATA"):
        msg = email.parser.Parser().parsestr(meta.read_text(encoding="utf-8", errors="replace"))
        name = _canon(msg["Name"])
        carried.add(name)
        for req in msg.get_all("Requires-Dist") or []:
            r = Requirement(req)
            if r.marker and not r.marker.evaluate({"extra": "", "python_version": "3.12", "os_name": "posix",
                                                   "sys_platform": "linux", "platform_system": "Linux"}):
                continue
            needs.setdefault(_canon(r.name), set()).add(name)
    missing = {d: sorted(by) for d, by in needs.items() if d not in carried | IMAGE_HAS | NBG_OPTIONAL}
    if missing:
        raise SystemExit(f"--nbgrader: needed, neither carried nor on the GPU image: {missing}")
    print(f"closure: {len(carried)} packages carried; every need is carried, on the GPU image or optional "
          f"({', '.join(sorted(NBG_OPTIONAL & set(needs)))})")


def image_standin(dest: Path) -> Path:
    """A folder standing in for the GPU image's packages: links to this interpreter's copies of the
    IMAGE_HAS packages (torch, numpy, jinja2, ...) and nothing else."""
    import importlib.metadata as md
    dest.mkdir(parents=True, exist_ok=True)
    for dist in md.distributions():
        if _canon(dist.metadata["Name"] or "") not in IMAGE_HAS:
            continue
        for f in dist.files or []:
            top = f.parts[0]
            if top.endswith((".dist-info", ".data")) or top in ("..", "bin", "__pycache__") or top.endswith(".pth"):
                if not top.endswith(".dist-info"):
                    continue
            src = Path(dist.locate_file(top))
            if src.exists() and not (dest / top).exists():
                (dest / top).symlink_to(src)
    return dest


def isolated_python(where: Path) -> Path:
    """A virtual environment with nothing installed (its site-packages empty): an interpreter that
    imports only what PYTHONPATH names, the kernels it starts (sys.executable) too."""
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(where)], check=True)
    return where / "bin" / "python"


def isolated_env(d: Path, standin: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "JUPYTER", "VIRTUAL_ENV"))}
    env.update(PYTHONPATH=os.pathsep.join([str(d / "site"), str(standin), str(ROOT / "src"), str(ROOT)]),
               JUPYTER_PATH=str(d / "share" / "jupyter"), PATH=f"{d / 'bin'}{os.pathsep}{env.get('PATH', '')}",
               PYTHONDONTWRITEBYTECODE="1", JUPYTER_PLATFORM_DIRS="1")
    return env


def verify_nbgrader(out: Path) -> None:
    """Unpack into a temporary folder and, from an empty virtual environment with only that folder and a
    stand-in for the GPU image's packages on PYTHONPATH: import the grading stack (from the folder),
    find the kernelspec, run alembic, start a kernel and run a cell in it."""
    code = f"""
import os, sys, time
t0 = time.time()
import nbgrader, nbclient, nbconvert, nbformat, ipykernel, zmq, sqlalchemy, alembic, jupyter_client, tornado
from nbgrader.apps.nbgraderapp import NbGraderApp
from nbgrader.api import Gradebook
import nbgrader.converters.autograde
for m in (nbgrader, nbclient, ipykernel, zmq, sqlalchemy, alembic, jupyter_client, tornado):
    assert m.__file__.startswith({{d!r}}), m.__file__
t1 = time.time()
from jupyter_client.kernelspec import KernelSpecManager
specs = KernelSpecManager().find_kernel_specs()
assert specs.get("python3", "").startswith({{d!r}}), specs
import subprocess
print(subprocess.run(["alembic", "--version"], capture_output=True, text=True, check=True).stdout.strip())
from jupyter_client.manager import start_new_kernel
km, kc = start_new_kernel(kernel_name="python3")
t2 = time.time()
reply = kc.execute_interactive("import sys, ipykernel, zmq; print(sys.executable, ipykernel.__file__, zmq.zmq_version())",
                               timeout=60, output_hook=lambda m: m["msg_type"] == "stream" and print("kernel:", m["content"]["text"].strip()))
assert reply["content"]["status"] == "ok", reply
kc.stop_channels(); km.shutdown_kernel(now=True)
with Gradebook("sqlite:///" + os.path.join({{d!r}}, "gb.db")) as gb:
    gb.add_assignment("a")
print(f"verified: nbgrader {{nbgrader.__version__}} imports in {{t1 - t0:.1f}} s from {{os.path.dirname(nbgrader.__file__)}}, "
      f"a kernel started in {{t2 - t1:.1f}} s and ran a cell; a gradebook created (alembic)")
"""
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        subprocess.run(["tar", "xJf", str(out), "-C", str(d)], check=True)
        py = isolated_python(d / "venv")
        env = isolated_env(d, image_standin(d / "image"))
        subprocess.run([str(py), "-c", code.replace("{d!r}", repr(str(d)))], env=env, check=True, cwd=d)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "carry" / "tilelang.tar.xz")
    ap.add_argument("--pythons", nargs="+", default=None,
                    help="CPython versions whose apache-tvm-ffi core goes in (default: 3.12 and this one)")
    ap.add_argument("--no-kernels", action="store_true", help="leave TileLang's kernel cache out")
    ap.add_argument("--verify", action="store_true", help="check the archive here afterwards")
    ap.add_argument("--fib", action="store_true",
                    help="pack FlashInfer-Bench and its imports instead (default --out carry/fib.tar.xz); it "
                         "unpacks beside the TileLang archive: site/ is shared")
    ap.add_argument("--flashinfer", action="store_true",
                    help="pack FlashInfer's prefill kernel instead (default --out carry/flashinfer.tar.xz); it "
                         "unpacks beside the TileLang archive and uses its apache-tvm-ffi")
    ap.add_argument("--nbgrader", action="store_true",
                    help="pack the grading side instead (default --out carry/nbgrader.tar.xz): nbgrader, "
                         "nbconvert, ipykernel, ... (NBG_PINS), for `python -m autograder autograde` there")
    args = ap.parse_args(argv)
    global PINS
    if args.nbgrader:
        if args.out == ROOT / "carry" / "tilelang.tar.xz":
            args.out = ROOT / "carry" / "nbgrader.tar.xz"
        here = ".".join(map(str, sys.version_info[:3]))     # full: some pins need 3.11.5 or later
        pythons = args.pythons or list(dict.fromkeys(["3.12", here]))
        t0 = time.time()
        with tempfile.TemporaryDirectory() as tmp:
            stage = Path(tmp)
            build_nbgrader(stage, pythons)
            raw = sum(f.stat().st_size for f in stage.rglob("*") if f.is_file() and not f.is_symlink())
            pack(stage, args.out)
        mb = args.out.stat().st_size / 2**20
        print(f"wrote {args.out} ({mb:.1f} MiB, {raw / 2**20:.0f} MiB unpacked; Pythons {', '.join(pythons)}) "
              f"in {time.time() - t0:.0f} s")
        if args.verify:
            verify_nbgrader(args.out)
        rel = os.path.relpath(args.out, ROOT)
        print(f"on the GPU machine (carry = [\"{rel}\"]), start the command with:\n  {nbgrader_prefix(rel)}")
        return 0
    if args.flashinfer:
        if args.out == ROOT / "carry" / "tilelang.tar.xz":
            args.out = ROOT / "carry" / "flashinfer.tar.xz"
        t0 = time.time()
        with tempfile.TemporaryDirectory() as tmp:
            stage = Path(tmp) / "stage"
            build_flashinfer(stage / "site", Path(tmp))
            raw = sum(f.stat().st_size for f in stage.rglob("*") if f.is_file())
            pack(stage, args.out)
        print(f"wrote {args.out} ({args.out.stat().st_size / 2**20:.1f} MiB, {raw / 2**20:.0f} MiB unpacked) "
              f"in {time.time() - t0:.0f} s")
        rel = os.path.relpath(args.out, ROOT)
        print(f"on the GPU machine (carry = [\"carry/tilelang.tar.xz\", \"{rel}\"]), start the command with:\n  "
              f"{device_prefix()} tar xJf {rel} -C /tmp/tl &&")
        return 0
    if args.fib:
        PINS, args.no_kernels = FIB_PINS, True
        if args.out == ROOT / "carry" / "tilelang.tar.xz":
            args.out = ROOT / "carry" / "fib.tar.xz"
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    pythons = args.pythons or list(dict.fromkeys(["3.12", here]))
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        stage = Path(tmp)
        site = stage / "site"
        for i, py in enumerate(pythons):
            pins = PINS if i == 0 else [p for p in PINS if p.replace("-", "_").startswith(VERSION_SPECIFIC)]
            for whl in download(py, pins):
                unpack_wheel(whl, site, only_version_specific=i > 0)
        prune(site)
        if not args.no_kernels:
            if shutil.which("nvcc") is None:
                print("note: no nvcc here: the archive carries no kernels (the GPU machine compiles them)")
            elif here not in pythons:
                print(f"note: this Python ({here}) is not in --pythons: the archive carries no kernels")
            else:
                if args.out.exists():            # the kernels already carried: only new ones compile
                    subprocess.run(["tar", "xJf", str(args.out), "-C", str(stage), "cache"], check=False)
                build_kernels(site, stage / "cache")
                prune(site)                      # nothing the build left (it writes no bytecode)
        raw = sum(f.stat().st_size for f in stage.rglob("*") if f.is_file() and not f.is_symlink())
        pack(stage, args.out)
    mb = args.out.stat().st_size / 2**20
    print(f"wrote {args.out} ({mb:.1f} MiB, {raw / 2**20:.0f} MiB unpacked; Pythons {', '.join(pythons)}) "
          f"in {time.time() - t0:.0f} s")
    if mb > LIMIT_MB:
        print(f"warning: over {LIMIT_MB} MiB: with the working tree it may pass the GPU machine's 64 MiB")
    if args.verify and not args.fib:
        verify(args.out)
    rel = os.path.relpath(args.out, ROOT)
    print(f"on the GPU machine (carry = [\"{rel}\"]), start the command with:\n  {device_prefix(rel)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
