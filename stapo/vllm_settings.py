"""vLLM engine settings for the device the harness runs on, the recipe's overrides, and clear vLLM errors.

vLLM does two jobs here: rollouts inside training (TRL's GRPOTrainer, ``vllm_mode: colocate``) and evaluation
(lm-eval's ``vllm`` backend). Its defaults are GPU defaults, and three of them fail or crawl on a CPU:
``gpu_memory_utilization`` is a fraction of *RAM* on CPU (0.9 asks for 90 % of the machine and fails), CUDA graph
capture does not exist there (eager mode), and bf16 is ~3x slower than fp32 on CPUs without bf16 instructions.
vLLM's CPU build also pins the OpenMP threads of the whole process (the trainer too) to cores unless
``VLLM_CPU_OMP_THREADS_BIND=nobind``. So the harness picks per-device defaults here and the recipe overrides any
of them:

- training: ``train.vllm_gpu_memory_utilization`` (None = device default) and ``train.vllm`` (extra TRL
  ``vllm_*`` options, keys without the prefix, e.g. ``{enable_sleep_mode: true}``);
- evaluation: ``eval.vllm`` (lm-eval vllm model args: dtype, gpu_memory_utilization, enforce_eager, ...).

vLLM's CPU build is published as the distribution ``vllm-cpu``; lm-eval asks ``importlib.metadata.version("vllm")``,
so the separate test environment (``make test-vllm``) adds a metadata-only ``vllm`` distribution whose version
carries ``+cpu`` (vLLM's platform detection looks for "cpu" in it): ``python -m stapo.vllm_settings shim``.
On a CPU, TRL's colocated engine needs two fixes that GPUs do not (:func:`patch_trl_for_cpu`): its weight sync
goes through vLLM's in-place reload, and the engine runs in the trainer's dtype.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import logging
import os
import sys
import sysconfig
from stapo.core.atomic import atomic_write
from stapo.core.fields import check_keys
from pathlib import Path

from stapo.core.errors import ArgumentParser

__all__ = ["DEVICE_DEFAULTS", "CPU_ENV", "VllmUnavailable", "device_kind", "trl_vllm_kwargs", "eval_engine_args",
           "prepare_env", "require_vllm", "vllm_version", "patch_trl_for_cpu", "repack_kept_cpu_weights",
           "write_dist_shim"]

log = logging.getLogger("stapo.vllm")

# Per device: TRL colocate rollouts ("train", GRPOConfig vllm_* fields without the prefix) and lm-eval's vllm
# model args ("eval"). GPU: the paper's colocate split (half the memory to the engine, half to training) and
# lm-eval's usual 0.9 for a GPU that only evaluates. CPU: fractions of RAM sized for a 24 GiB, 2-core machine
# running a small model next to the trainer; eager + fp32.
DEVICE_DEFAULTS = {
    "cuda": {
        "train": {"gpu_memory_utilization": 0.5},
        "eval": {"dtype": "bfloat16", "gpu_memory_utilization": 0.9, "tensor_parallel_size": 1},
    },
    "cpu": {
        "train": {"gpu_memory_utilization": 0.1},
        "eval": {"dtype": "float32", "gpu_memory_utilization": 0.1, "tensor_parallel_size": 1,
                 "enforce_eager": True},
    },
}
# Set (unless the user already set them) before vLLM starts on a CPU. VLLM_CPU_KVCACHE_SPACE (GiB): an explicit KV
# cache; without it vLLM's CPU worker sizes the cache as gpu_memory_utilization x node RAM minus the whole process's
# RSS, which a colocated trainer (~1.5 GiB of torch, TRL, vLLM) alone exceeds on a 12 GiB node: the engine refuses.
CPU_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_CPU_KVCACHE_SPACE": "1"}

INSTALL_HINT = {
    "cuda": "install the GPU stack: `conda env create -f environment.yml` (pins vllm with its CUDA torch)",
    "cpu": "install vLLM's CPU build in a separate environment: `make test-vllm` builds .venv-vllm "
           "(vllm-cpu + a metadata shim), or run without vLLM (train.use_vllm: false, eval.backend: hf)",
}


class VllmUnavailable(RuntimeError):
    """vLLM is missing, fails to import, or is the build for the other device; the message names the fix."""


def device_kind() -> str:
    """"cuda" when torch sees a GPU, else "cpu" (what vLLM's platform detection will also pick)."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _overlay(defaults: dict, overrides: dict | None, where: str) -> dict:
    if overrides is not None and not isinstance(overrides, dict):
        raise ValueError(f"{where}: must be a mapping of vLLM options, got {type(overrides).__name__}")
    return {**defaults, **(overrides or {})}


def trl_vllm_kwargs(settings, device: str | None = None, *, check: bool = True) -> dict:
    """GRPOConfig's ``use_vllm`` / ``vllm_*`` kwargs for ``settings`` (a TrainSettings) on ``device``.

    Device defaults (DEVICE_DEFAULTS[device]["train"], and max_model_length = max prompt + completion length)
    < ``settings.vllm`` < ``settings.vllm_gpu_memory_utilization`` when not None. With ``use_vllm`` false only
    ``use_vllm=False`` is returned (TRL generates with the policy).
    ``check``: when vLLM will be used, fail now (before any model loads) if it is missing or broken.
    """
    if not settings.use_vllm:
        return {"use_vllm": False}
    device = device or device_kind()
    # the engine's context only needs a prompt plus a completion (the model's max positions may be far larger)
    defaults = {**DEVICE_DEFAULTS[device]["train"],
                "max_model_length": settings.max_prompt_length + settings.max_completion_length}
    options = _overlay(defaults, getattr(settings, "vllm", None), "train.vllm")
    try:
        check_keys(options, _trl_vllm_options(), "train.vllm")
    except ValueError as err:
        raise ValueError(f"{err} (TRL's GRPOConfig vllm_* fields without the prefix)") from None
    if getattr(settings, "vllm_gpu_memory_utilization", None) is not None:
        options["gpu_memory_utilization"] = settings.vllm_gpu_memory_utilization
    _check_fraction(options.get("gpu_memory_utilization"), "train.vllm_gpu_memory_utilization", device)
    if check:
        require_vllm(device, purpose="train.use_vllm: true")
        if device == "cpu":
            patch_trl_for_cpu("bfloat16" if settings.bf16 else "float32")
    return {"use_vllm": True, "vllm_mode": settings.vllm_mode, **{f"vllm_{k}": v for k, v in options.items()}}


def _trl_vllm_options() -> set[str]:
    """TRL's GRPOConfig ``vllm_*`` fields without the prefix, less those the recipe sets elsewhere."""
    from trl import GRPOConfig

    fields = {k[len("vllm_"):] for k in GRPOConfig.__dataclass_fields__ if k.startswith("vllm_")}
    return fields - {"mode"} - {k for k in fields if k.startswith("importance_sampling")}


def eval_engine_args(overrides: dict | None, device: str | None = None) -> dict:
    """lm-eval vllm model args: DEVICE_DEFAULTS[device]["eval"] overlaid with the recipe's ``eval.vllm``."""
    device = device or device_kind()
    args = _overlay(DEVICE_DEFAULTS[device]["eval"], overrides, "eval.vllm")
    _check_fraction(args.get("gpu_memory_utilization"), "eval.vllm.gpu_memory_utilization", device)
    return args


def _check_fraction(value, key: str, device: str) -> None:
    if value is None:
        return
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.0 < value <= 1.0:
        raise ValueError(f"{key}: must be a fraction in (0, 1], got {value!r}")
    if device == "cpu" and value > 0.5:
        log.warning("%s = %s: on CPU this is a fraction of the machine's RAM, which vLLM will likely fail to "
                    "allocate; the CPU default is %s", key, value,
                    DEVICE_DEFAULTS["cpu"]["train"]["gpu_memory_utilization"])


def prepare_env(device: str) -> dict:
    """Set CPU_ENV (only keys the user has not set) before vLLM starts on a CPU; returns what was set."""
    if device != "cpu":
        return {}
    added = {k: v for k, v in CPU_ENV.items() if k not in os.environ}
    os.environ.update(added)
    return added


def vllm_version() -> str | None:
    """The version lm-eval and vLLM's platform detection read (``version("vllm")``), or None when absent."""
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None


def require_vllm(device: str | None = None, *, purpose: str = "vLLM") -> str:
    """Import vLLM for ``device`` or raise VllmUnavailable naming the fix; returns vLLM's version string.

    Checks, in order: the ``vllm`` module exists; it imports (a CUDA torchvision/torchaudio next to a CPU torch, or
    a vLLM built against another torch, fails here); the distribution metadata lm-eval reads exists; the build
    matches the device (a ``+cpu`` build on a GPU machine, or a GPU build on a CPU machine, picks no platform).
    """
    device = device or device_kind()
    hint = INSTALL_HINT[device]
    prepare_env(device)
    if importlib.util.find_spec("vllm") is None:
        raise VllmUnavailable(f"{purpose} needs the vllm package, which is not installed; {hint}")
    try:
        importlib.import_module("vllm")
    except Exception as err:  # noqa: BLE001 - any import failure means the same fix
        raise VllmUnavailable(
            f"{purpose}: vllm is installed but fails to import ({type(err).__name__}: {err}); a torchvision, "
            f"torchaudio or torchcodec built for another torch is the usual cause (`pip uninstall -y torchvision "
            f"torchaudio torchcodec`), else reinstall: {hint}") from err
    version = vllm_version()
    if version is None:
        raise VllmUnavailable(
            f"{purpose}: vllm imports but has no 'vllm' distribution metadata (lm-eval and vLLM read "
            f"importlib.metadata.version('vllm')); for the vllm-cpu build run `python -m stapo.vllm_settings shim`")
    is_cpu_build = "cpu" in version
    if device == "cuda" and is_cpu_build:
        raise VllmUnavailable(f"{purpose}: vllm {version} is the CPU build but this machine has a GPU; {hint}")
    if device == "cpu" and not is_cpu_build:
        raise VllmUnavailable(f"{purpose}: vllm {version} is a GPU build and this machine has no GPU; {hint}")
    return version


def repack_kept_cpu_weights(model) -> list[str]:
    """Re-pack the CPU GEMM copies of layers that keep their weight (embedding / LM head); returns their names.

    vLLM's CPU build gives every linear-like layer a ``cpu_linear`` kernel over a packed copy of its weight. Linear
    layers drop the weight (empty) and are re-packed by ``reload_weights``; layers that keep it (the LM head, tied
    to the embedding) are not, and would go on computing logits from the weights they were loaded with.
    """
    repacked = []
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        method = getattr(module, "quant_method", None)
        if hasattr(module, "cpu_linear") and method is not None and weight is not None and weight.numel() > 0:
            method.process_weights_after_loading(module)
            repacked.append(name)
    return repacked


def patch_trl_for_cpu(dtype: str = "float32", module=None):
    """Make TRL's colocated vLLM engine work on vLLM's CPU build (idempotent); returns the patched module.

    1. Weight sync. After loading, vLLM's CPU linear layers prepack their weights for oneDNN and replace the
       parameters TRL's colocate sync writes into (``model.load_weights`` fails: 'Parameter' object has no
       attribute 'weight_loader'). vLLM's own in-place reload (``model_runner.reload_weights``, checkpoint
       format) restores the layers, loads the new weights and prepacks again; the patched ``sync_weights`` uses
       it in colocate mode and leaves server mode to TRL. The reload misses one layer: a (tied) LM head keeps its
       weight but computes logits from a oneDNN copy packed at load time, so it is packed again
       (:func:`repack_kept_cpu_weights`).
    2. Engine dtype. TRL builds ``LLM(...)`` without a dtype, and vLLM's "auto" downcasts an fp32 model to bf16:
       on CPU the engine then samples from a different policy than the fp32 trainer holds, ~3x slower on CPUs
       without bf16 instructions. The engine gets the trainer's ``dtype`` and eager mode unless TRL passes them.
    GPUs never call this (there TRL and vLLM run as released).
    """
    if module is None:
        import trl.generation.vllm_generation as module
    cls = module.VLLMGeneration
    if not getattr(cls.sync_weights, "_stapo_cpu_reload", False):
        original = cls.sync_weights

        def sync_weights(self):
            if self.mode != "colocate":
                return original(self)
            runner = self.llm.llm_engine.model_executor.driver_worker.model_runner
            weights = ((name, param.detach()) for name, param in self._iter_named_params())
            runner.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
            repack_kept_cpu_weights(runner.model)
            self.llm.reset_prefix_cache()

        sync_weights._stapo_cpu_reload = True
        cls.sync_weights = sync_weights
    llm = getattr(module.LLM, "_stapo_original", module.LLM)

    def cpu_llm(*args, **kwargs):
        kwargs.setdefault("dtype", dtype)
        kwargs.setdefault("enforce_eager", True)
        return llm(*args, **kwargs)

    cpu_llm._stapo_original = llm
    module.LLM = cpu_llm
    return module


def write_dist_shim(site_packages: str | os.PathLike | None = None, base: str = "vllm-cpu") -> Path:
    """Write a metadata-only ``vllm`` distribution (version ``<vllm-cpu version>+cpu``) into ``site_packages``.

    No code: the ``vllm`` module is vllm-cpu's. Returns the dist-info directory (idempotent).
    """
    version = importlib.metadata.version(base)
    local = version if "cpu" in version else f"{version}+cpu"
    root = Path(site_packages or sysconfig.get_paths()["purelib"])
    dist = root / f"vllm-{local}.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    files = {"METADATA": f"Metadata-Version: 2.1\nName: vllm\nVersion: {local}\n"
                         f"Summary: metadata shim: the vllm module is provided by {base} {version}\n",
             "INSTALLER": "stapo\n"}
    for name, text in files.items():
        atomic_write(dist / name, text, inside=dist)
    record = "".join(f"{dist.name}/{name},,\n" for name in [*files, "RECORD"])
    atomic_write(dist / "RECORD", record, inside=dist)
    return dist


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m stapo.vllm_settings", description=__doc__.splitlines()[0])  # 1-line errors
    sub = parser.add_subparsers(dest="command", required=True)
    shim = sub.add_parser("shim", help="write the metadata-only 'vllm' distribution for vllm-cpu")
    shim.add_argument("--site-packages", help="target directory (default: this interpreter's purelib)")
    check = sub.add_parser("check", help="import vLLM for this device or print the fix")
    check.add_argument("--device", choices=sorted(DEVICE_DEFAULTS))
    args = parser.parse_args(argv)
    if args.command == "shim":
        print(write_dist_shim(args.site_packages))
        return 0
    try:
        print(f"vllm {require_vllm(args.device)} ok")
    except VllmUnavailable as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
