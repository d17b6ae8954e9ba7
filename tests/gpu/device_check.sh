#!/usr/bin/env bash
# The device check of the CUDA path (docs/gpu.md), in one script, for a machine like the GPU
# check machine: Python 3.12 with jax and jax-cuda13-plugin, mpi4py, nanobind,
# scikit-build-core, cmake, ninja and a CUDA toolkit (nvcc); NO MPI library and NO network.
# What it lacks comes along in .whl/ (`make gpu-wheels` downloads it here): the mpich wheel,
# and mpi4py's, used only if the machine's own mpi4py cannot load MPICH.
#
#   bash tests/gpu/device_check.sh      (or: make test-gpu)
#
# It installs MPICH into a scratch prefix, builds jaxcache there with JAXCACHE_CUDA=ON
# against the jax it finds (no network: --no-index, --no-build-isolation), runs tests/gpu at
# 1 rank and at 2 ranks sharing GPU 0 (XLA_PYTHON_CLIENT_MEM_FRACTION=0.3), and prints the
# bandwidth line. Every step has a time limit; the whole check takes a few minutes.
#
#   PYTHON=...                   the interpreter to use (default: python3)
#   JAXCACHE_CHECK_PLATFORM=cpu  dry run on CPU arrays, for a machine without a GPU
#   OUT=dir                      also write the log to dir/device_check.log
set -uo pipefail
cd "$(dirname "$0")/../.."
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  exec > >(tee -a "$OUT/device_check.log") 2>&1
fi
T0=$(date +%s)
step() { echo; echo "== [$(( $(date +%s) - T0 ))s] $*"; }
fail() { echo "DEVICE CHECK FAILED after $(( $(date +%s) - T0 ))s: $*"; exit 1; }

PY=${PYTHON:-python3}
PREFIX=${JAXCACHE_CHECK_PREFIX:-/tmp/jaxcache-device-check}
export PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INDEX=1

step "environment"
"$PY" - <<'EOF' || fail "python or jax missing"
import importlib.metadata as md, platform, sys
print("python", platform.python_version(), sys.executable)
for p in ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda12-plugin", "mpi4py", "nanobind",
          "scikit-build-core", "cmake", "ninja", "torch", "pytest", "pytest-timeout"):
    try:
        print(f"  {p} {md.version(p)}")
    except md.PackageNotFoundError:
        print(f"  {p} -")
EOF
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
# CMake finds the CUDA toolkit through nvcc on PATH (or /usr/local/cuda).
NVCC=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc /usr/local/cuda-*/bin/nvcc 2>/dev/null | head -1)
if [ -z "$NVCC" ]; then
  echo "no nvcc found: the build relies on CMake finding a CUDA toolkit elsewhere (CUDAToolkit_ROOT)"
else
  command -v nvcc >/dev/null || export PATH="$(dirname "$NVCC"):$PATH"
  echo "nvcc: $NVCC"; "$NVCC" --version | tail -2
fi

step "install the carried MPICH into $PREFIX"
ls .whl/mpich-*.whl >/dev/null 2>&1 || fail "no .whl/mpich-*.whl: run 'make gpu-wheels' before bringing the tree"
rm -rf "$PREFIX"
timeout 120 "$PY" -m pip install -q --no-deps --no-compile --ignore-installed --prefix "$PREFIX" .whl/mpich-*.whl \
  || fail "installing the mpich wheel"
SITE=$("$PY" -c "import sysconfig as s; v={'base': '$PREFIX', 'platbase': '$PREFIX'}; print(s.get_path('platlib', vars=v) + ':' + s.get_path('purelib', vars=v))")
export PATH="$PREFIX/bin:$PATH" LD_LIBRARY_PATH="$PREFIX/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
MPI_PROBE="from mpi4py import MPI; c = MPI.COMM_WORLD; assert c.allreduce(1) == c.size; \
c.rank or print('  MPI ok:', c.size, 'ranks,', MPI.Get_library_version().splitlines()[0], MPI.Query_thread() == MPI.THREAD_MULTIPLE)"
if ! timeout 60 "$PY" -c "$MPI_PROBE"; then
  echo "this mpi4py cannot use the carried MPICH: installing the carried mpi4py wheel"
  ls .whl/mpi4py-*.whl >/dev/null 2>&1 || fail "no .whl/mpi4py-*.whl"
  timeout 120 "$PY" -m pip install -q --no-deps --no-compile --ignore-installed --prefix "$PREFIX" .whl/mpi4py-*.whl \
    || fail "installing the mpi4py wheel"
  timeout 60 "$PY" -c "$MPI_PROBE" || fail "mpi4py cannot load MPICH"
fi

step "MPI at 2 ranks (with fallbacks for a machine without a network)"
mpi_ok() { timeout 60 mpirun -np 2 "$PY" -c "$MPI_PROBE"; }
if ! mpi_ok; then
  echo "retrying with the fork launcher and localhost only"
  printf 'localhost\n' > "$PREFIX/hosts"
  export HYDRA_LAUNCHER=fork HYDRA_HOST_FILE="$PREFIX/hosts"
  if ! mpi_ok; then
    echo "retrying with ofi over tcp on loopback"
    export MPIR_CVAR_CH4_NETMOD=ofi FI_PROVIDER=tcp FI_TCP_IFACE=lo
    if ! mpi_ok; then
      echo "retrying with ucx over shared memory and loopback"
      export MPIR_CVAR_CH4_NETMOD=ucx UCX_TLS=self,sm,tcp UCX_NET_DEVICES=lo
      unset FI_PROVIDER FI_TCP_IFACE
      mpi_ok || fail "mpirun -np 2 does not work here"
    fi
  fi
fi

step "build jaxcache with JAXCACHE_CUDA=ON against the jax found here"
JAXCACHE_CUDA=ON timeout 400 "$PY" -m pip install -q --no-build-isolation --no-deps --no-compile \
  --ignore-installed --prefix "$PREFIX" . || fail "building jaxcache"
(cd / && timeout 120 "$PY" - <<'EOF') || fail "importing jaxcache"
import jax, jaxcache
from jaxcache import _ext, devices
print("  jaxcache from", jaxcache.__file__)
print(f"  built against XLA FFI API {_ext.BUILT_FFI_API}, jaxlib provides {_ext.RUNNING_FFI_API}")
print("  cuda_built", jaxcache.cuda_built(), "cuda_available", jaxcache.cuda_available(),
      devices.cuda_unavailable_reason() or "", "| jax devices", jax.devices())
EOF

step "tests/gpu: 1 rank, then 2 ranks sharing GPU 0, then the bandwidth line"
if [ "${JAXCACHE_CHECK_PLATFORM:-}" = cpu ]; then echo "DRY RUN on CPU arrays (JAXCACHE_CHECK_PLATFORM=cpu)"; fi
JAXCACHE_REQUIRE_GPU=1 timeout 480 "$PY" -m pytest -p no:cacheprovider -s -v -rs tests/gpu
rc=$?
step "done"
[ $rc -eq 0 ] || fail "tests/gpu (pytest exit code $rc)"
echo "DEVICE CHECK PASSED in $(( $(date +%s) - T0 ))s"
