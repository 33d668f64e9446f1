#!/usr/bin/env bash
# One command for a lent GPU: see benchmarks/gpu_check.py (prints step times, memory, tokens/s, GPU-hour inputs).
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python}" benchmarks/gpu_check.py "$@"
