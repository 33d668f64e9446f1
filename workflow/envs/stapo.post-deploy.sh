#!/usr/bin/env bash
# Run by Snakemake in the new rule environment (--software-deployment-method conda), from the directory it runs in:
# installs the project itself (the `stapo` command of every rule) without re-resolving its CPU pins.
set -euo pipefail
if ! grep -qs '^name = "stapo"' pyproject.toml; then
  echo "stapo.post-deploy.sh: run snakemake from the repository root (no stapo pyproject.toml in $PWD)" >&2
  exit 1
fi
pip install --no-deps -e .
