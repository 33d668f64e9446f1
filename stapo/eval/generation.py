"""Generation for ``stapo eval``: lm-eval's ``hf`` / ``vllm`` backends behind a resumable, seeded cache.

lm-eval's own request cache skips sampled requests (every repeat would be identical), so generations go through
:class:`ResumableLM`: a sqlite cache next to the output (``FILE.cache.sqlite``, :class:`GenerationCache`) keyed by
the weights' fingerprint (:func:`model_fingerprint`: SHA-256 of their content), every generation parameter
(backend, its settings, seed, stop tokens, sampling) and (prompt, repeat index), committed chunk by chunk. The
sampling seeds come from the weight files' content and the generation settings only (:func:`seed_identity`), so
the same commit samples the same completions on any machine. A killed
evaluation, rerun, generates only what is missing, and gets the completions an uninterrupted run would have got
(every request sampled from its own seeded generator; see ResumableLM). Generation stops at every end-of-turn
token of the model's tokenizer (:func:`with_stop_tokens`; Qwen3-Base's EOS is ``<|endoftext|>`` but its chat
template ends a turn with ``<|im_end|>``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from collections import Counter, deque
from pathlib import Path

from stapo.core.manifest import digests, model_files
from stapo.eval.cache import GenerationCache, cache_path
from stapo.models import end_of_turn_token_ids, end_of_turn_tokens
from stapo.study.evaluation import Backend, EvalConfig
from stapo.tasks.registry import TASKS_DIR, task_name
from stapo import vllm_settings

__all__ = ["GenerationCache", "ResumableLM", "build_lm", "generate", "generation_identity", "model_fingerprint",
           "weights_fingerprint", "weights_sha256", "seed_identity",
           "cache_path", "with_stop_tokens", "CHUNK_REQUESTS", "MAX_PROMPT_TOKENS"]

log = logging.getLogger("stapo.eval")

MAX_PROMPT_TOKENS = 1024  # paper: max prompt length 1k
CHUNK_REQUESTS = {Backend.HF: 16, Backend.VLLM: 2048}  # requests generated between two cache commits
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")  # not their index (.json)


def model_fingerprint(model_path: str, known: dict[str, str] | None = None) -> str:
    """A cache key for the files behind ``model_path`` (not its name, size or mtime).

    Local directory: sha256 over (name, SHA-256 of the content) of its weight, index, config and tokenizer files
    (stapo.core.manifest.model_files; a checkpoint's optimizer state is not read), so different weights at the same path
    regenerate even with the same sizes and restored mtimes; copying a checkpoint keeps its cache. ``known``:
    digests already computed for this directory's files (stapo eval's preflight verifies a checkpoint's manifest,
    which reads those files: they are not read twice). Hub id: the id and the cached snapshot's commit when the HF
    cache has one (``HF_HUB_OFFLINE`` runs use exactly that snapshot), else the id alone.
    The sampling seeds do not come from this key but from :func:`weights_fingerprint`.
    """
    path = Path(model_path)
    if path.is_dir():
        entries = sorted(_digests(path, model_files(path), known).items())
        return "sha256:" + hashlib.sha256(json.dumps(entries).encode()).hexdigest()
    snapshot = _hub_snapshot(model_path)
    return f"{model_path}@{snapshot.name}" if snapshot else model_path


def _digests(path: Path, names: list[str], known: dict[str, str] | None) -> dict[str, str]:
    known = known or {}
    return {**digests(path, [n for n in names if n not in known]), **{n: known[n] for n in names if n in known}}


def _hub_snapshot(model_id: str) -> Path | None:
    """The HF cache's snapshot directory of a hub id, or None (not cached, or not a repo id)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(model_id, "config.json")
    except Exception:  # not a valid repo id for the cache lookup
        found = None
    return Path(found).parent if isinstance(found, str) else None


def weights_sha256(model_path: str, known: dict[str, str] | None = None) -> dict[str, str]:
    """{file: SHA-256} of the weight files behind ``model_path`` (a local directory, or a hub id's cached snapshot;
    {} when neither). The HF cache stores a weight file as a blob named by its SHA-256: that name is used, not
    re-read. A checkpoint's training state (optimizer.pt, rng_state.pth) is not a weight file."""
    path = Path(model_path)
    if not path.is_dir():
        path = _hub_snapshot(model_path)
        if path is None:
            return {}
    names = [n for n in model_files(path) if n.endswith(WEIGHT_SUFFIXES)]
    blobs = {n: Path(os.path.realpath(path / n)).name for n in names}
    named = {n: b for n, b in blobs.items() if len(b) == 64 and all(c in "0123456789abcdef" for c in b)}
    return {**_digests(path, [n for n in names if n not in named], known), **named}


def weights_fingerprint(model_path: str, known: dict[str, str] | None = None) -> str:
    """What the sampling seeds are drawn from: SHA-256 over the weight files' digests (:func:`weights_sha256`), so
    the same weights sample the same completions on any machine, whatever their tokenizer_config.json, config.json
    or generation_config.json record about how they were saved (issue 32: ``local_files_only`` followed
    HF_HUB_OFFLINE). A hub id not yet in the HF cache: the id."""
    found = weights_sha256(model_path, known)
    if not found:
        return model_path
    return "sha256:" + hashlib.sha256(json.dumps(sorted(found.items())).encode()).hexdigest()


def _lm_base():
    from lm_eval.api.model import LM

    return LM


class ResumableLM(_lm_base()):
    """Wraps an lm-eval LM: ``generate_until`` answers from the cache and generates only the missing requests.

    lm-eval hands the N repeats of a prompt as N identical requests; the k-th occurrence is repeat k, so the key is
    sha256(identity, prompt, generation kwargs, k), where ``identity`` holds the model files' fingerprint and every
    generation parameter outside the kwargs (backend, its settings, seed). ``stats`` counts cache hits and
    generated requests. The seeds come from the same formula over ``seed_identity`` (default ``identity``):
    :func:`seed_identity` holds the weights and the generation settings only, so that nothing a machine writes
    beside the weights (a tokenizer_config.json option) changes what is sampled.

    Seeding: every request is sampled from a generator of its own, seeded from its key over ``seed_identity``, so
    a completion depends on its problem, repeat, weights and settings only: not on which other problems are
    evaluated (``--limit 4`` and ``--limit 20`` give the first four problems the same completions), nor on batches,
    chunks or a resume.
    ``seeding="request"`` (vLLM): each request carries its own ``seed`` (vLLM samples it from a private
    generator). ``seeding="row"`` (HF, whose sampler draws every row of a batch from one global generator):
    :class:`RowSampler` samples each row of lm-eval's batches from its request's generator, as HF's sampler
    would (temperature, then top-p, then a categorical draw), and HF decodes greedily on its choice. Requests are
    committed to the cache in chunks of ``chunk``.
    """

    def __init__(self, lm, cache_path: str | Path | None, identity, chunk: int = 16, seeding: str = "row",
                 store: "GenerationCache | None" = None, seed_identity=None):
        super().__init__()
        if seeding not in ("row", "request"):
            raise ValueError(f"ResumableLM: seeding must be 'row' or 'request', got {seeding!r}")
        self.lm, self.identity, self.chunk, self.seeding = lm, identity, chunk, seeding
        self.seed_identity = identity if seed_identity is None else seed_identity
        self.store = store if store is not None else GenerationCache(Path(cache_path))
        self.stats = {"cached": 0, "generated": 0}
        self._row_keys: dict[str, deque] = {}  # context -> keys of its requests in this chunk, in request order
        self._batch: list[str] = []  # the contexts of lm-eval's batch being generated, in row order
        if seeding == "row":
            self._sample_rows_by_key()

    def __getattr__(self, name):  # tokenizer, get_model_info, ... of the wrapped LM
        if name == "lm":
            raise AttributeError(name)
        return getattr(self.lm, name)

    @staticmethod
    def _keys(requests, identity) -> list[str]:
        seen: Counter = Counter()
        keys = []
        for req in requests:
            context, gen_kwargs = req.args[0], req.args[1]
            base = json.dumps([identity, context, gen_kwargs], sort_keys=True, default=str)
            keys.append(hashlib.sha256(f"{base}\x00{seen[base]}".encode()).hexdigest())
            seen[base] += 1
        return keys

    @staticmethod
    def _seed(*keys: str) -> int:
        return int(hashlib.sha256("".join(keys).encode()).hexdigest()[:8], 16)

    def _generate_chunk(self, requests, seeds: list[str], idx: list[int]) -> list[str]:
        if self.seeding == "request":  # requests are lm-eval Instances (dataclasses)
            todo = [dataclasses.replace(requests[i], arguments=(requests[i].args[0],
                                        {**requests[i].args[1], "seed": self._seed(seeds[i])})) for i in idx]
            return self.lm.generate_until(todo)
        self._row_keys = {}
        for i in idx:  # identical contexts (a problem's repeats) keep their order through lm-eval's stable sort
            self._row_keys.setdefault(requests[i].args[0], deque()).append(seeds[i])
        return self.lm.generate_until([requests[i] for i in idx])

    def _sample_rows_by_key(self) -> None:
        """Hook lm-eval's HF batch encoding (which contexts, in which rows) and generation (a RowSampler seeded
        from each row's request seed key) on the wrapped instance."""
        encode, generate = self.lm.tok_batch_encode, self.lm._model_generate

        def tok_batch_encode(strings, *args, **kwargs):
            self._batch = list(strings)
            return encode(strings, *args, **kwargs)

        def model_generate(context, max_length, stop, **kwargs):
            if kwargs.get("do_sample") and (kwargs.get("temperature") or 0) > 0:
                seeds = [self._seed(self._row_keys[c].popleft()) for c in self._batch]
                sampler = RowSampler(seeds, kwargs.pop("temperature"), kwargs.pop("top_p", 1.0))
                kwargs.pop("top_k", None)
                kwargs.update(do_sample=False,  # greedy on its choice, after any processor already given
                              logits_processor=_processors(*kwargs.get("logits_processor") or [], sampler))
            return generate(context, max_length, stop, **kwargs)

        self.lm.tok_batch_encode, self.lm._model_generate = tok_batch_encode, model_generate

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        keys = self._keys(requests, self.identity)
        seeds = keys if self.seed_identity is self.identity else self._keys(requests, self.seed_identity)
        found = self.store.get_many(keys)
        missing = sum(k not in found for k in keys)
        self.stats["cached"] += len(requests) - missing
        log.info("generation cache: %d of %d requests cached, %d to generate", len(requests) - missing,
                 len(requests), missing)
        for start in range(0, len(requests), self.chunk):
            chunk_keys = keys[start : start + self.chunk]
            idx = [start + j for j, k in enumerate(chunk_keys) if k not in found]
            if not idx:
                continue
            texts = self._generate_chunk(requests, seeds, idx)
            self.store.put_many([(keys[i], t) for i, t in zip(idx, texts, strict=True)])
            found.update((keys[i], t) for i, t in zip(idx, texts))
            self.stats["generated"] += len(idx)
            log.info("generated %d / %d", self.stats["generated"], missing)
        return [found[k] for k in keys]

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError("stapo eval only generates")

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError("stapo eval only generates")


class RowSampler:
    """An HF logits processor that samples row i of the batch from its own generator (seeded ``seeds[i]``), as
    HF's sampler draws from the global one: logits / temperature, top-p (HF's TopPLogitsWarper: the smallest set
    of tokens whose probability reaches top_p, at least one), a categorical draw. It returns 0 at the drawn token
    and -inf elsewhere, so greedy decoding emits it. [B, V] in, [B, V] out."""

    def __init__(self, seeds: list[int], temperature: float, top_p: float):
        self.seeds, self.temperature, self.top_p = seeds, float(temperature), float(top_p)
        self.generators = None  # made on the logits' device at the first step

    def __call__(self, input_ids, scores):
        import torch

        if self.generators is None:
            self.generators = [torch.Generator(device=scores.device).manual_seed(s) for s in self.seeds]
        logits = scores.float() / self.temperature
        if self.top_p < 1.0:
            ascending, order = torch.sort(logits, descending=False)
            drop = ascending.softmax(dim=-1).cumsum(dim=-1) <= 1 - self.top_p
            drop[..., -1:] = False
            logits = logits.masked_fill(drop.scatter(1, order, drop), float("-inf"))
        probs = logits.softmax(dim=-1)
        drawn = torch.cat([torch.multinomial(probs[i], 1, generator=g) for i, g in enumerate(self.generators)])
        out = torch.full_like(scores, float("-inf"))
        return out.scatter_(1, drawn[:, None], 0.0)


def _processors(*processors):
    from transformers import LogitsProcessorList

    return LogitsProcessorList(processors)


def build_lm(cfg: EvalConfig, model_path: str):
    """lm-eval's ``hf`` (CPU, or one GPU when there is one) or ``vllm`` (GPU) model for ``model_path``."""
    import torch
    from lm_eval.api.registry import get_model

    max_len = cfg.max_new_tokens + MAX_PROMPT_TOKENS
    if cfg.backend is Backend.HF:
        args = {"pretrained": model_path, "max_length": max_len, **cfg.backend_args}
        batch_size = args.pop("batch_size", 8)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        return get_model("hf").create_from_arg_obj(args, {"batch_size": batch_size, "device": device})
    vllm_settings.require_vllm(purpose="eval backend 'vllm' (--backend hf, or eval.backend: hf, runs without it)")
    args = {"pretrained": model_path, "max_model_len": max_len, "seed": cfg.seed,
            **vllm_settings.eval_engine_args(cfg.backend_args)}
    return get_model("vllm").create_from_arg_obj(args, {"batch_size": "auto"})




def seed_identity(cfg: EvalConfig, model_path: str, known: dict[str, str] | None = None) -> dict:
    """What the sampling seeds are drawn from besides (prompt, gen kwargs, repeat): the weights
    (:func:`weights_fingerprint`) and the generation settings, nothing a machine records beside the weights."""
    return {"weights": weights_fingerprint(model_path, known), "backend": cfg.backend,
            "backend_args": cfg.backend_args, "seed": cfg.seed, "max_length": cfg.max_new_tokens + MAX_PROMPT_TOKENS,
            "seeding": cfg.backend.seeding,
            "protocol": cfg.protocol,  # the prompt keys the cache too; the protocol says so explicitly
            **({"worked_example": cfg.worked_example} if cfg.worked_example else {})}


def generation_identity(cfg: EvalConfig, model_path: str, known: dict[str, str] | None = None) -> dict:
    """Everything besides (prompt, gen kwargs, repeat) that decides a completion: part of every cache key
    (``known``: :func:`model_fingerprint`'s already computed file digests). The seeds: :func:`seed_identity`."""
    return {"model": model_fingerprint(model_path, known), **seed_identity(cfg, model_path, known)}


def with_stop_tokens(cfg: EvalConfig, tokenizer) -> EvalConfig:
    """``cfg`` with the tokenizer's end-of-turn tokens as stop strings and ids (stapo.models.end_of_turn_tokens)."""
    return dataclasses.replace(cfg, stop=end_of_turn_tokens(tokenizer), stop_ids=end_of_turn_token_ids(tokenizer))


def generate(cfg: EvalConfig, model_path: str, store: GenerationCache,
             known: dict[str, str] | None = None) -> tuple[list[dict], dict]:
    """Run lm-eval; one entry per problem {problem_id, problem, gold, gold_justrl, completions[N]} and the cache stats
    (``known``: SHA-256 of the model's files, already verified by the caller)."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    backend = build_lm(cfg, model_path)  # first: a hub id is in the HF cache from here on (its weights' digests)
    lm = ResumableLM(backend, None, generation_identity(cfg, model_path, known), CHUNK_REQUESTS[cfg.backend],
                     cfg.backend.seeding, store=store, seed_identity=seed_identity(cfg, model_path, known))
    meta = {"data_dir": cfg.data_dir, "tokenizer": model_path, "arith": cfg.arith or None, "name": cfg.benchmark,
            "protocol": cfg.protocol, "worked_example": cfg.worked_example,
            "file": None if cfg.file is None else str(Path(cfg.file).resolve())}
    manager = TaskManager(include_path=str(TASKS_DIR), include_defaults=False, metadata=meta)
    name = task_name(cfg.benchmark)
    task = manager.load([name])["tasks"][name]
    task.set_config(key="repeats", value=cfg.n)
    task.set_config(key="generation_kwargs", value=cfg.gen_kwargs())
    out = lm_eval.simple_evaluate(
        model=lm, tasks=[task], task_manager=manager, limit=cfg.limit, predict_only=True, log_samples=True,
        bootstrap_iters=0, random_seed=cfg.seed, numpy_random_seed=cfg.seed, torch_random_seed=cfg.seed)
    problems = []
    for sample in sorted(out["samples"][name], key=lambda s: s["doc_id"]):
        completions = [r for group in sample["resps"] for r in (group if isinstance(group, list) else [group])]
        if len(completions) != cfg.n:
            raise RuntimeError(f"{name} doc {sample['doc_id']}: {len(completions)} completions, expected {cfg.n}")
        doc = sample["doc"]
        problems.append({"problem_id": doc["id"], "problem": doc["problem"], "gold": doc["answer"],
                         "gold_justrl": doc.get("answer_justrl") or doc["answer"], "completions": completions})
    return problems, dict(lm.stats)
