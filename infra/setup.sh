#!/usr/bin/env bash
# One-command setup: creates .venv and installs the whole platform (torch stack, Spark, Feast,
# Great Expectations, Airflow, MLflow) in the order DESIGN.md requires. Safe to run twice: the
# second run only checks a stamp of the requirement files and exits in seconds.
#   LATTICE_TORCH_INDEX=https://download.pytorch.org/whl/cpu  lets pip take torch's CPU wheel
#   instead of PyPI's CUDA build on machines without a local CPU wheel.
#   LATTICE_WITH_SERVICES=0  skips Debian's postgresql + redis-server + prometheus (the scale-out profile's services).
#   LATTICE_WITH_BROWSER=0  skips Debian's chromium + chromedriver, which the browser tests of the
#   README's test command need (installed by default, so the one setup command covers the suite).
#   LATTICE_GPU=1  (GPU machines only) installs CUDA torch, fbgemm-gpu and torchrec with its
#   dependencies instead of the CPU stack; LATTICE_GPU_TORCH_INDEX picks the wheel index
#   (default: PyTorch's cu128 index). Unset, nothing below changes for CPU machines.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
VENV=.venv
STAMP=$VENV/.lattice-setup-stamp
want=$(cat requirements-torch.txt requirements.txt requirements.lock pyproject.toml infra/setup.sh | sha256sum | cut -c1-16)
if [ "${LATTICE_GPU:-0}" = 1 ]; then want="$want-gpu"; fi  # switching stacks reinstalls

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && $VENV/bin/python -c "import importlib.util as u, sys; sys.exit(not all(u.find_spec(m) for m in ('torchrec', 'pyspark', 'feast', 'airflow', 'lattice')))" 2>/dev/null; then
  echo "setup: .venv is up to date ($want)"
else
  [ -x $VENV/bin/python ] || "$PY" -m venv $VENV
  PIP="$VENV/bin/pip --disable-pip-version-check"
  extra=()
  [ -n "${LATTICE_TORCH_INDEX:-}" ] && extra=(--extra-index-url "$LATTICE_TORCH_INDEX")
  if [ "${LATTICE_GPU:-0}" = 1 ]; then
    gpu_index=${LATTICE_GPU_TORCH_INDEX:-https://download.pytorch.org/whl/cu128}
    echo "setup: [1/3] torch stack for CUDA (torch 2.13 and fbgemm-gpu 1.8 from $gpu_index, torchrec 1.8 with its deps)"
    # torch and fbgemm-gpu from one index, so both are built for the same CUDA
    $PIP install -q --index-url "$gpu_index" --extra-index-url https://pypi.org/simple torch==2.13.0 fbgemm-gpu==1.8.0
    grep -vE '^(torch|fbgemm-gpu-cpu)==' requirements-torch.txt > $VENV/.requirements-torch-gpu.txt
    $PIP install -q -r $VENV/.requirements-torch-gpu.txt torchrec==1.8.0
  else
  echo "setup: [1/3] torch stack (torch 2.13 CPU, fbgemm-gpu-cpu 1.8, torchrec 1.8 --no-deps)"
  $PIP install -q "${extra[@]}" -r requirements-torch.txt -c requirements.lock
  # torchrec declares the CUDA fbgemm-gpu; its real deps are in requirements-torch.txt
  $PIP install -q --no-deps torchrec==1.8.0
  fi
  echo "setup: [2/3] data and orchestration stack (Spark, Feast, GX, Airflow, MLflow, test tools)"
  # requirements.lock pins every transitive version resolved on the dev machine, so CI and
  # users get the same environment (Airflow publishes its constraints on GitHub, out of reach).
  $PIP install -q "${extra[@]}" -r requirements.txt -c requirements.lock
  echo "setup: [3/3] the lattice package (editable)"
  $PIP install -q --no-deps --no-build-isolation -e .
  if [ "${LATTICE_GPU:-0}" != 1 ] && $PIP list 2>/dev/null | grep -qiE '^(fbgemm[-_]gpu\s|nvidia-)'; then
    echo "setup: a CUDA package was pulled in; refusing to continue" >&2; exit 1
  fi
  echo "$want" > "$STAMP"
fi

if [ "${LATTICE_WITH_BROWSER:-1}" != "0" ] && ! command -v chromium >/dev/null; then
  echo "setup: installing chromium + chromium-driver (Debian) for browser tests"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  # env: with SUDO empty, a bare VAR=value after an expansion would be run as a command
  if ! { $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; }; then
    echo "setup: could not install chromium (apt-get failed); the two browser tests will fail." >&2
    echo "setup: install Debian's chromium + chromium-driver by hand, or set LATTICE_WITH_BROWSER=0 to skip this step" >&2
    exit 1
  fi
fi
# The scale-out profile's services (issue 20; `infra/scale-out up` starts them on loopback, the
# scaleout tests of the test command too). Debian's packages; none is started here.
if [ "${LATTICE_WITH_SERVICES:-1}" != "0" ] && { ! command -v redis-server >/dev/null || ! command -v prometheus >/dev/null || ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; }; then
  echo "setup: installing postgresql + redis-server + prometheus (Debian) for the scale-out profile"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  if ! { $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql redis-server prometheus >/dev/null; }; then
    echo "setup: could not install postgresql/redis-server/prometheus (apt-get failed); the scaleout tests will fail." >&2
    echo "setup: install them by hand, or set LATTICE_WITH_SERVICES=0 to skip this step" >&2
    exit 1
  fi
  # Debian's packages start system-wide instances; the platform runs its own on other ports
  for svc in redis-server postgresql prometheus; do $SUDO service "$svc" stop >/dev/null 2>&1 || true; done
fi
echo "setup: done. Try: .venv/bin/lattice --help"
