"""Cost of the SHA-256 checkpoint manifest (stapo.core.manifest) at Qwen3-1.7B-Base's shape on CPU.

    .venv/bin/python benchmarks/bench_checksums.py [--dir /tmp] [--dtype bfloat16] [--rounds 2] [--json OUT.json]

Writes the weights of a model with Qwen3-1.7B's shape (28 layers, hidden 2048, intermediate 6144, 16 query / 8 KV
heads of 128, vocabulary 151,936, tied embeddings: 1.72 B parameters; ~3.4 GB in bf16) as one safetensors file,
as ``save_pretrained`` does, then times, per round: the save itself (``safetensors.torch.save_file``: write +
fsync), the manifest right after it (``write_manifest``: sizes + SHA-256 of every file, read back from the page
cache, as the checkpoint callback does), and the verification a resume runs (``verify``). A full training
checkpoint (fp32 weights + AdamW's two fp32 moments, ~20.6 GB at this shape) costs its size / the measured hash
throughput; the script prints that estimate. The file is removed at the end.

Figures (2026-12-03, the project's 2-core CPU VM (sha_ni), shared with two other sessions, load average ~2.5-3.4),
default command, bf16, 3.44 GB:
    round 1: save + fsync 13.78 s, SHA-256 manifest 4.72 s (0.73 GB/s, +34 % of the save), verification 4.92 s
    round 2: save + fsync 16.80 s, SHA-256 manifest 4.55 s (0.76 GB/s, +27 % of the save), verification 5.10 s
    => 0.76 GB/s = 1.3 s per GB saved (CPU-bound: hashlib on 1 GB in memory ran at 0.69 GB/s on the same machine
    then); a full training checkpoint at this shape (20.6 GB) adds ~27 s to its save and as much to a resume's
    verification (files of a checkpoint are hashed in parallel threads; one file is one thread). Only the resume
    checkpoint is read in full on a resume; older checkpoints get the size / structure checks.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

SHAPE = dict(layers=28, hidden=2048, intermediate=6144, heads=16, kv_heads=8, head_dim=128, vocab=151936)


def qwen3_state(dtype):
    """Zero tensors with Qwen3-1.7B's parameter shapes (the content does not change hashing or writing speed)."""
    import torch

    s, h, i, d = SHAPE, SHAPE["hidden"], SHAPE["intermediate"], SHAPE["head_dim"]
    state = {"model.embed_tokens.weight": torch.zeros(s["vocab"], h, dtype=dtype),
             "model.norm.weight": torch.zeros(h, dtype=dtype)}
    for n in range(s["layers"]):
        p = f"model.layers.{n}."
        state |= {p + "self_attn.q_proj.weight": torch.zeros(s["heads"] * d, h, dtype=dtype),
                  p + "self_attn.k_proj.weight": torch.zeros(s["kv_heads"] * d, h, dtype=dtype),
                  p + "self_attn.v_proj.weight": torch.zeros(s["kv_heads"] * d, h, dtype=dtype),
                  p + "self_attn.o_proj.weight": torch.zeros(h, s["heads"] * d, dtype=dtype),
                  p + "self_attn.q_norm.weight": torch.zeros(d, dtype=dtype),
                  p + "self_attn.k_norm.weight": torch.zeros(d, dtype=dtype),
                  p + "mlp.gate_proj.weight": torch.zeros(i, h, dtype=dtype),
                  p + "mlp.up_proj.weight": torch.zeros(i, h, dtype=dtype),
                  p + "mlp.down_proj.weight": torch.zeros(h, i, dtype=dtype),
                  p + "input_layernorm.weight": torch.zeros(h, dtype=dtype),
                  p + "post_attention_layernorm.weight": torch.zeros(h, dtype=dtype)}
    return state


def main(argv: list[str] | None = None) -> int:
    import torch
    from safetensors.torch import save_file

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from stapo.core.manifest import COMPLETE, verify, write_manifest

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where the checkpoint is written")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)

    state = qwen3_state(getattr(torch, args.dtype))
    params = sum(t.numel() for t in state.values())
    ckpt = Path(tempfile.mkdtemp(prefix="bench-checksums-", dir=args.dir))
    rows = []
    try:
        for r in range(args.rounds):
            (ckpt / COMPLETE).unlink(missing_ok=True)
            t0 = time.perf_counter()
            save_file(state, str(ckpt / "model.safetensors"))
            with open(ckpt / "model.safetensors", "rb+") as f:
                os.fsync(f.fileno())
            t1 = time.perf_counter()
            write_manifest(ckpt, COMPLETE, 1)
            t2 = time.perf_counter()
            found, _ = verify(ckpt, COMPLETE)
            t3 = time.perf_counter()
            assert found == [], found
            size = (ckpt / "model.safetensors").stat().st_size
            rows.append({"round": r + 1, "bytes": size, "save_s": t1 - t0, "manifest_s": t2 - t1, "verify_s": t3 - t2})
            print(f"round {r + 1}: {size / 1e9:.2f} GB; save + fsync {t1 - t0:.2f} s, SHA-256 manifest {t2 - t1:.2f} s "
                  f"({size / 1e9 / (t2 - t1):.2f} GB/s, +{100 * (t2 - t1) / (t1 - t0):.0f} % of the save), resume "
                  f"verification {t3 - t2:.2f} s", flush=True)
    finally:
        for p in ckpt.iterdir():
            p.unlink()
        ckpt.rmdir()
    best = min(rows, key=lambda r: r["manifest_s"])
    gbps = best["bytes"] / 1e9 / best["manifest_s"]
    full = params * (4 + 8) / 1e9  # fp32 weights + AdamW exp_avg, exp_avg_sq
    summary = {"params": params, "dtype": args.dtype, "rounds": rows, "hash_gb_per_s": gbps,
               "manifest_s_per_gb": 1 / gbps, "full_checkpoint_gb": full, "full_checkpoint_hash_s": full / gbps}
    print(f"\n{params / 1e9:.2f} B parameters ({args.dtype}): SHA-256 {gbps:.2f} GB/s = {1 / gbps:.2f} s per GB saved; "
          f"a full training checkpoint at this shape (fp32 weights + AdamW moments, {full:.1f} GB) adds "
          f"~{full / gbps:.0f} s to its save and to the resume's verification")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
