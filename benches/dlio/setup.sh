#!/usr/bin/env bash
# Installs MLPerf Storage's DLIO benchmark (dlio-benchmark 2.0.0) into its own venv, for the
# unet3d / PyTorch comparison of lobster-io's DLIO data-loader plug-in against DLIO's loader.
# Idempotent: re-running on an existing venv only re-checks the pins (a few seconds).
#
# Plain `pip install dlio-benchmark` fails (it requires nvidia-dali-cuda110, GPU-only), so DLIO
# goes in with --no-deps and its real run-time deps are installed by hand, pinned to the
# versions that were tested (see benches/dlio/NOTES.md). torch/torchvision come from PyPI
# (the CUDA build, ~4 GB of nvidia-* wheels: it runs fine on CPU; torch --no-deps does not
# import without them). Set DLIO_TORCH_INDEX_URL to use another torch wheel index instead.
# tensorflow-cpu is needed even for PyTorch runs: dlio_benchmark/main.py imports it at start.
# Whole venv: ~7 GB; fresh install took ~2.5 min here.
#
# Usage: [DLIO_VENV=/work/venv-dlio] [PYTHON=python3] benches/dlio/setup.sh
set -euo pipefail
venv=${DLIO_VENV:-/work/venv-dlio}
python=${PYTHON:-python3}

# mpi4py's wheel loads the system MPI at run time; mpirun launches the ranks.
if ! command -v mpirun >/dev/null || ! command -v mpicc >/dev/null; then
    if [[ $(id -u) == 0 ]]; then
        apt-get update -q
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q libopenmpi-dev openmpi-bin
    else
        echo "setup.sh: needs OpenMPI (apt-get install libopenmpi-dev openmpi-bin)" >&2
        exit 1
    fi
fi

[[ -x $venv/bin/python ]] || "$python" -m venv "$venv"
pip=("$venv/bin/pip" install -q --disable-pip-version-check)

# 1. DLIO itself, without its declared deps (nvidia-dali-cuda110, tensorflow, torchaudio).
"${pip[@]}" --no-deps dlio-benchmark==2.0.0
# 2. Its run-time deps (pydftracer must be 1.0.2: DLIO 2.0.0 pins it).
"${pip[@]}" "numpy==2.2.6" "pillow==13.0.0" "pyyaml==6.0.4" "h5py==3.14.0" "mpi4py==4.1.2" \
    "omegaconf==2.3.1" "pandas==3.1.2" "psutil==7.2.2" "pydftracer==1.0.2" "hydra-core==1.3.8"
# 3. PyTorch (the framework of the unet3d workload).
torch_index=()
[[ -n ${DLIO_TORCH_INDEX_URL:-} ]] && torch_index=(--index-url "$DLIO_TORCH_INDEX_URL")
"${pip[@]}" "${torch_index[@]}" "torch==2.15.0" "torchvision==0.29.2" "numpy==2.2.6"
# 4. TensorFlow (CPU build; imported unconditionally by dlio_benchmark/main.py).
"${pip[@]}" "tensorflow-cpu==2.21.0" "numpy==2.2.6" "h5py==3.14.0"

[[ -x $venv/bin/dlio_benchmark ]] || { echo "setup.sh: no dlio_benchmark entry point" >&2; exit 1; }
echo "venv: $venv"
TF_CPP_MIN_LOG_LEVEL=3 "$venv/bin/python" - <<'PY' 2>&1 | grep -a -v -E '^(I0000|WARNING: All log messages)'
import importlib.metadata as md, sys
print("python", sys.version.split()[0])
for d in ["dlio-benchmark", "numpy", "torch", "torchvision", "tensorflow-cpu", "mpi4py", "h5py",
          "hydra-core", "omegaconf", "pandas", "pydftracer"]:
    print(f"{d} {md.version(d)}")
from mpi4py import MPI
print("MPI library:", MPI.Get_library_version().rstrip("\x00").splitlines()[0])
import dlio_benchmark.main  # noqa: F401  (pulls in tensorflow and hydra, as a run does)
print("dlio_benchmark.main imports: ok")
PY
mpirun --version | head -1
