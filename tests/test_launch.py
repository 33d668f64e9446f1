"""stapo.core.launch: the training job's launch line for one device, one node, and N nodes (srun + accelerate launch);
and the workflow rendering it: the paper's 8 x 8 job in a dry run, and without a cluster profile one node."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from stapo.core import launch

from stapo import study

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PAPER = REPO / "configs" / "paper.yaml"

# The paper's topology, as the workflow renders it for configs/accelerate/fsdp.yaml.
PAPER_LINE = (
    'STAPO_MAIN_IP=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1) '
    "STAPO_MAIN_PORT=$((20000 + SLURM_JOB_ID % 20000)) "
    "srun --nodes=8 --ntasks-per-node=1 --gpus-per-node=8 --kill-on-bad-exit=1 bash -c "
    "'[ \"$SLURM_NODEID\" = 0 ] || unset STAPO_DRIVER; trap \"\" USR1; exec accelerate launch --config_file {config} "
    "--num_machines 8 --num_processes 64 --machine_rank \"$SLURM_NODEID\" --main_process_ip \"$STAPO_MAIN_IP\" "
    "--main_process_port \"$STAPO_MAIN_PORT\" -m stapo.cli \"$@\"' stapo-train")


def test_one_device_and_one_node():
    assert launch.train_launcher(0) == launch.train_launcher(1) == "stapo"
    assert launch.train_launcher(8, 1, "configs/accelerate/fsdp.yaml") == (
        "accelerate launch --config_file configs/accelerate/fsdp.yaml --num_processes 8 -m stapo.cli")
    with pytest.raises(ValueError, match="accelerate config"):
        launch.train_launcher(8, 2, None)


def test_eight_nodes_render_srun_and_one_accelerate_launch_per_node():
    line = launch.train_launcher(8, 8, "configs/accelerate/fsdp.yaml")
    assert line == PAPER_LINE.format(config="configs/accelerate/fsdp.yaml")
    # each node's task: $SLURM_NODEID is expanded by its own shell (single quotes keep it from the batch shell)
    words = shlex.split(line)
    inner = words[words.index("-c") + 1]
    assert '--machine_rank "$SLURM_NODEID"' in inner and words[-1] == "stapo-train"
    spaced = launch.train_launcher(2, 2, "/a dir/it's.yaml")  # a path the shell must not split
    inner = shlex.split(spaced)[shlex.split(spaced).index("-c") + 1]
    assert shlex.split(inner.split(";", 2)[2])[4] == "/a dir/it's.yaml"


def test_paper_study_trains_on_8_nodes_of_8_gpus():
    paper = study.read(PAPER, required=(), check_runs=False)
    for key, entry in paper.models.items():
        assert (entry.nodes, entry.gpus, entry.processes) == (8, 8, 64), key
    with pytest.raises(ValueError, match=r"models\.m\.nodes: 2 nodes need gpus >= 1"):
        study.parse({"study": "x", "models": {"m": {"spec": "bundled:tiny-qwen3", "nodes": 2}}}, required=(),
                    check_runs=False)
    with pytest.raises(ValueError, match=r"models\.m\.accelerate_config: required when gpus = 1 > 1 or nodes = 2"):
        study.parse({"study": "x", "models": {"m": {"spec": "bundled:tiny-qwen3", "gpus": 1, "nodes": 2}}},
                    required=(), check_runs=False)


def _snakemake(*args, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "HF_HUB_OFFLINE": "1"}
    cmd = [str(BIN / "snakemake"), "-s", str(REPO / "Snakefile"), "-d", str(cwd), *map(str, args)]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_workflow_renders_the_paper_job_as_8_nodes(tmp_path):
    """A dry run of one paper training job prints its shell line: the srun / accelerate launch line above."""
    res = _snakemake("-n", "-p", "--configfile", PAPER, "--", "runs/qwen3-8b-base/stapo/final", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    out = res.stdout + res.stderr
    assert "rule train_nodes:" in out
    config = REPO / "configs" / "accelerate" / "fsdp.yaml"  # -d elsewhere: the config beside the Snakefile
    assert PAPER_LINE.format(config=shlex.quote(str(config))) + " train --recipe" in out


def test_without_a_cluster_profile_a_multi_node_model_trains_on_this_node(tmp_path):
    """`snakemake --cores N` (or the local profile) runs a model declared for 2 nodes on this one node: one line
    says so, the job's launch is one node's (no srun), and `stapo train` sizes the accumulation from its processes:
    the same global batch, twice the accumulation of a 2-node job."""
    overlay = tmp_path / "two-nodes.yaml"
    overlay.write_text(yaml.safe_dump({"models": {"tiny-qwen3": {"gpus": 1, "nodes": 2,
                                                                 "accelerate_config": "configs/accelerate/ddp.yaml"}},
                                       "train": {"max_steps": 1, "diagnostics_every": 0},
                                       "workflow": {"models": ["tiny-qwen3"]}}))
    res = _snakemake("--profile", REPO / "workflow" / "profiles" / "local", "--cores", "1", "--configfile",
                     REPO / "configs" / "tiny.yaml", overlay, "--", "runs/tiny-qwen3/stapo/final", cwd=tmp_path)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    said = [line for line in out.splitlines() if line.startswith("stapo: models.tiny-qwen3.nodes")]
    assert said == ["stapo: models.tiny-qwen3.nodes = 2, but no cluster profile: it trains on this one node's 1 "
                    "GPU(s) with the same global batch (2 prompts x 8 rollouts per optimiser step), 2x the gradient "
                    "accumulation; --profile workflow/profiles/slurm runs it on 2 nodes"], out[-3000:]
    assert "srun --nodes" not in out and "stapo.continue && stapo train --recipe" in out  # one node: `stapo`
    trl = yaml.safe_load((tmp_path / "runs" / "tiny-qwen3" / "stapo" / "config.yaml").read_text())["trl"]
    assert (trl["num_processes"], trl["gradient_accumulation_steps"], trl["generation_batch_size"]) == (1, 2, 16)
    settings = study.read(REPO / "configs" / "tiny.yaml").train_settings("tiny-qwen3")
    assert study.accumulation(settings, 2)[0] == 1  # on the 2 nodes it was declared for: half the accumulation
