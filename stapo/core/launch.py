"""The command line that starts one training job: ``stapo``, ``accelerate launch``, or ``srun`` + ``accelerate launch``
on several nodes. workflow/rules/common.smk renders it into the train rules' shell (``{launcher} train ...``).

One node:   ``stapo`` (one device) or ``accelerate launch --config_file C --num_processes G -m stapo.cli``.
N nodes (the SLURM profile; the paper: 8 nodes × 8 GPUs): the job's batch shell names the rendezvous, the first node
of the allocation and a port from the job id, and ``srun`` starts one task per node; each runs
``accelerate launch --num_machines N --num_processes N·G --machine_rank $SLURM_NODEID --main_process_ip <first node>
--main_process_port <port>``, whose G processes per node join one process group of N·G ranks (FSDP across all of
them, as the accelerate config says). ``$SLURM_NODEID`` is expanded by each task's own shell, not the batch shell.
Rank 0 (on the first node) writes checkpoints and final/ to the shared file system; a resubmitted job resumes from
them on whatever nodes it gets. The workflow's driver watch (stapo.core.driver) names a process of the first node, so
the other nodes' tasks drop it; ``srun --kill-on-bad-exit`` ends every node's task when one fails, and cancelling
the job ends them all.
"""

from __future__ import annotations

import shlex

from stapo.core import driver

__all__ = ["PORT_BASE", "train_launcher"]

PORT_BASE = 20000  # main_process_port = PORT_BASE + job id mod 20000: two jobs sharing a node do not collide


def train_launcher(gpus: int, nodes: int = 1, accelerate_config: str | None = None) -> str:
    """The launcher prefix of ``<launcher> train --recipe ...`` for a job of ``nodes`` × ``gpus`` (module docstring).
    Every value put in the shell line is shell-quoted."""
    if nodes <= 1 and gpus <= 1:
        return "stapo"
    if not accelerate_config:
        raise ValueError(f"{nodes} node(s) x {gpus} GPU(s) need an accelerate config")
    config = shlex.quote(str(accelerate_config))
    if nodes <= 1:
        return f"accelerate launch --config_file {config} --num_processes {int(gpus)} -m stapo.cli"
    nodes, gpus = int(nodes), int(gpus)
    per_node = (f'[ "$SLURM_NODEID" = 0 ] || unset {driver.ENV}; trap "" USR1; '  # USR1: for the trainer only
                f"exec accelerate launch --config_file {config} --num_machines {nodes} --num_processes {nodes * gpus} "
                '--machine_rank "$SLURM_NODEID" --main_process_ip "$STAPO_MAIN_IP" '
                '--main_process_port "$STAPO_MAIN_PORT" -m stapo.cli "$@"')
    return ('STAPO_MAIN_IP=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1) '
            f"STAPO_MAIN_PORT=$(({PORT_BASE} + SLURM_JOB_ID % 20000)) "
            f"srun --nodes={nodes} --ntasks-per-node=1 --gpus-per-node={gpus} --kill-on-bad-exit=1 "
            f"bash -c {shlex.quote(per_node)} stapo-train")
