"""The ``eval`` section of a study: the evaluation protocol, over the paper's defaults.

``benchmarks`` and ``settings`` list what the study evaluates (the workflow plans one job per benchmark ×
setting); a benchmark or setting the section does not list falls back to the paper's (stapo.tasks.registry), so
``stapo eval`` can run any of them with any study file. A benchmark is data: a key the registry does not know
evaluates its own ``file`` (``{file: mine.jsonl, label: Mine, samples: 8}``), and any setting key may be declared
with its ``temperature`` and ``top_p``. ``hf: {batch_size: 4}`` keeps the other ``hf`` defaults.
``stapo eval`` resolves one (benchmark, setting) job from the section (stapo.evaluate.resolve_config), the command
line overriding it.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field

from stapo.data import EVAL_PROTOCOLS, check_worked_example
from stapo.tasks.registry import ARITH_DEFAULTS, BENCHMARKS, FILE_SAMPLES, SETTINGS

__all__ = ["EvalSection", "EvalConfig", "BenchmarkEntry", "BACKENDS", "VERIFIER_DEFAULTS", "VERIFIER_KEYS",
           "check_verifier_config"]

BACKENDS = ("hf", "vllm")
VERIFIER_DEFAULTS = {
    "model": "opencompass/CompassVerifier-3B",
    "max_new_tokens": 16,  # the reply is one letter (the card's example allows 2048 for its CoT prompt)
    "backend_args": {},  # merged over eval.<backend> for the verifier's engine (e.g. gpu_memory_utilization)
}
VERIFIER_KEYS = set(VERIFIER_DEFAULTS)


@dataclass(frozen=True)
class BenchmarkEntry:
    """One entry of ``eval.benchmarks``.

    Attributes:
        file: the benchmark's own jsonl (rows id, problem, answer; a path, relative to the working directory):
            required for a key the registry (stapo.tasks.registry) does not ship; for a shipped one it replaces
            ``eval.data_dir``'s file.
        label: what tables and figures show (default: the registry's label, else the key).
        samples: N samples per problem (avg@N); None = the paper's N for a shipped benchmark, else
            ``FILE_SAMPLES`` (4).
        limit: evaluate only the first N problems (overrides ``eval.limit``).
        max_new_tokens: response budget (overrides ``eval.max_new_tokens``).
        n, seed, difficulty: ``arith`` only: the generated problems (stapo.data.synthetic_arith_rows).
    """

    file: str | None = None
    label: str | None = None
    samples: int | None = None
    limit: int | None = None
    max_new_tokens: int | None = None
    n: int | None = None
    seed: int | None = None
    difficulty: int | None = None

    @property
    def arith(self) -> dict:
        """The arith generator's options given here."""
        return {k: getattr(self, k) for k in ARITH_DEFAULTS if getattr(self, k) is not None}


@dataclass(frozen=True)
class EvalSection:
    """The ``eval`` section.

    Attributes:
        backend: ``vllm`` (GPU; the paper's) or ``hf`` (transformers; CPU and tests), through lm-eval.
        data_dir: where benchmark rows come from: None / ``bundled`` (the files in stapo/tasks/data), ``hub``, or
            a directory of ``<benchmark>.jsonl`` files.
        max_new_tokens: response budget in tokens (paper 20,480).
        limit: evaluate only the first N problems of each benchmark (None = all).
        benchmarks: the benchmarks evaluated: key -> :class:`BenchmarkEntry` (a shipped benchmark of
            stapo.tasks.registry, or any key with its own ``file``; default all shipped ones).
        settings: the sampling settings evaluated: key -> ``{temperature, top_p}`` and an optional ``label``
            (default the paper's two, stapo.tasks.registry.SETTINGS).
        hf: lm-eval ``hf`` model arguments (CPU defaults: batch size 8, float32).
        vllm: lm-eval ``vllm`` model arguments over the device's defaults (stapo.vllm_settings.eval_engine_args).
        verifier: the LLM-verifier stage (stapo.verifier), e.g. ``{model: opencompass/CompassVerifier-3B}``
            (keys of ``VERIFIER_DEFAULTS``); None = rule grading only.
        protocol: how the prompt, the rule stage, the gold and the verifier's inputs and verdicts are made (one of
            ``stapo.data.EVAL_PROTOCOLS``). ``justrl`` (default, the paper's: it evaluates with JustRL's code,
            thunlp/JustRL @ cf444e9 ``evals/gen_vllm.py``, ``evals/grade.py`` and ``evals/utils.py``): the problem
            and the \\boxed{} instruction joined by one space in the model's chat template; the rule stage is
            JustRL's ``grade_answer_verl`` (stapo.justrl_grading: the last \\boxed{}, mathd normalisation, then
            sympy) against JustRL's gold strings (the benchmark rows' ``answer_raw``, else ``answer``); the
            verifier is given an empty question (grade.py reads a ``question`` field its generation files do not
            have) and that gold, and only a reply that is exactly ``A`` counts as correct. ``harness`` (this
            harness's original protocol): a blank line between problem and instruction; the strict final box by
            math-verify against the clean ``answer``; the verifier sees the problem and its reply is parsed
            leniently (stapo.verifier.parse_verdict: ``A: CORRECT``, ``CORRECT``, ``\\boxed{A}``). Both rule
            stages' verdicts are in every per-sample record either way (stapo.scoring.build_records). Recorded in each
            summary's ``generation`` block and part of the generation cache's key.
        worked_example: ``{problem, solution}``: one worked exchange shown before every problem's prompt
            (stapo.data.build_prompt; the CPU miniature's model writes ``\\boxed{}`` only when shown how); None (the
            paper) = none. Recorded in each summary's ``generation`` block and part of the generation cache's key.
    """

    backend: str = "vllm"
    data_dir: str | None = None
    max_new_tokens: int = 20480
    limit: int | None = None
    benchmarks: dict = field(default_factory=lambda: {k: BenchmarkEntry() for k in BENCHMARKS})
    settings: dict = field(default_factory=lambda: copy.deepcopy(SETTINGS))
    hf: dict = field(default_factory=lambda: {"batch_size": 8, "dtype": "float32"})
    vllm: dict = field(default_factory=dict)
    verifier: dict | None = None
    protocol: str = "justrl"
    worked_example: dict | None = None

    @classmethod
    def from_dict(cls, section: dict | None) -> "EvalSection":
        """The section merged over the defaults and validated (ValueError naming ``eval.<key>``)."""
        section = dict(section or {})
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(section) - known)
        if unknown:
            raise ValueError(f"eval: unknown key(s) {unknown}; expected some of {sorted(known)}")
        base = cls()
        benchmarks = {} if "benchmarks" in section else dict(base.benchmarks)
        for key, entry in (section.pop("benchmarks", None) or {}).items():
            fields_ = {f.name for f in dataclasses.fields(BenchmarkEntry)}
            bad = sorted(set(entry or {}) - fields_)
            if bad:
                raise ValueError(f"eval.benchmarks.{key}: unknown key(s) {bad}; expected {sorted(fields_)}")
            if key not in BENCHMARKS and not (entry or {}).get("file"):
                raise ValueError(f"eval.benchmarks.{key}: not a shipped benchmark ({', '.join(BENCHMARKS)}): give "
                                 "its rows as file: <path.jsonl>")
            benchmarks[key] = BenchmarkEntry(**(entry or {}))
        settings = section.pop("settings", None) or base.settings
        hf = {**base.hf, **(section.pop("hf", None) or {})}
        out = dataclasses.replace(base, benchmarks=benchmarks, settings=settings, hf=hf, **section)
        out.check()
        return out

    def check(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"eval.backend: {self.backend!r}; expected one of {list(BACKENDS)}")
        for key, value in (("max_new_tokens", self.max_new_tokens), ("limit", self.limit)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"eval.{key}: expected an integer >= 1, got {value!r}")
        for key, entry in self.benchmarks.items():
            for name in ("samples", "limit", "max_new_tokens", "n", "difficulty"):
                value = getattr(entry, name)
                if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                    raise ValueError(f"eval.benchmarks.{key}.{name}: expected an integer >= 1, got {value!r}")
        for key, setting in self.settings.items():
            if set(setting or {}) - {"label"} != {"temperature", "top_p"}:
                raise ValueError(f"eval.settings.{key}: expected {{temperature, top_p}}, got {setting!r}")
            if not (setting["temperature"] >= 0 and 0 < setting["top_p"] <= 1):
                raise ValueError(f"eval.settings.{key}: need temperature >= 0 and top_p in (0, 1], got {setting}")
        for key in ("hf", "vllm"):
            if not isinstance(getattr(self, key), dict):
                raise ValueError(f"eval.{key}: expected a mapping of lm-eval model arguments")
        check_verifier_config(self.verifier)
        if self.protocol not in EVAL_PROTOCOLS:
            raise ValueError(f"eval.protocol: {self.protocol!r}; expected one of {list(EVAL_PROTOCOLS)}")
        check_worked_example(self.worked_example, "eval")

    def benchmark(self, key: str) -> BenchmarkEntry:
        """The section's entry of benchmark ``key`` (the paper's defaults when the section does not list it)."""
        return self.benchmarks.get(key) or BenchmarkEntry()

    def setting(self, key: str) -> dict:
        """``{temperature, top_p}`` of setting ``key``: the section's, else the paper's; KeyError if neither."""
        if key not in self.settings and key not in SETTINGS:
            raise KeyError(key)
        setting = self.settings.get(key) or SETTINGS[key]
        return {"temperature": setting["temperature"], "top_p": setting["top_p"]}

    def samples(self, benchmark: str) -> int:
        """N of ``benchmark``: the section's, else the paper's (``FILE_SAMPLES`` for a study's own file)."""
        entry = self.benchmark(benchmark)
        if entry.samples is not None:
            return entry.samples
        return BENCHMARKS[benchmark].samples if benchmark in BENCHMARKS else FILE_SAMPLES

    def known(self, benchmark: str) -> bool:
        """Whether ``benchmark`` can be evaluated: shipped, or listed here with its own file."""
        return benchmark in BENCHMARKS or bool(self.benchmark(benchmark).file)

    def uses_data_dir(self, benchmark: str) -> bool:
        """Whether ``benchmark``'s rows come from ``data_dir`` (a shipped file benchmark without its own file)."""
        return benchmark in BENCHMARKS and benchmark != "arith" and not self.benchmark(benchmark).file


def check_verifier_config(section) -> None:
    """``eval.verifier``: None (no verifier stage) or a mapping of ``VERIFIER_KEYS`` with a model spec."""
    if section is None:
        return
    if not isinstance(section, dict):
        raise ValueError(f"eval.verifier: expected a mapping like {{model: {VERIFIER_DEFAULTS['model']}}}, "
                         f"got {type(section).__name__}")
    unknown = set(section) - VERIFIER_KEYS
    if unknown:
        raise ValueError(f"eval.verifier: unknown key(s) {sorted(unknown)}; expected some of {sorted(VERIFIER_KEYS)}")
    model = section.get("model", VERIFIER_DEFAULTS["model"])
    if not isinstance(model, str) or not model.strip():
        raise ValueError(f"eval.verifier.model: expected a model id, path or bundled: spec, got {model!r}")
    tokens = section.get("max_new_tokens", VERIFIER_DEFAULTS["max_new_tokens"])
    if not isinstance(tokens, int) or tokens < 1:
        raise ValueError(f"eval.verifier.max_new_tokens: expected an integer >= 1, got {tokens!r}")
    if not isinstance(section.get("backend_args", {}), dict):
        raise ValueError("eval.verifier.backend_args: expected a mapping (merged over eval.<backend>)")


@dataclass
class EvalConfig:
    """The settings of one evaluation job (one benchmark × setting), resolved from the section and the command line
    (stapo.evaluate.resolve_config); the summary's ``generation`` block records them."""

    benchmark: str
    setting: str
    temperature: float
    top_p: float
    max_new_tokens: int
    n: int
    backend: str
    limit: int | None
    data_dir: str | None
    seed: int
    file: str | None = None  # the benchmark's own jsonl (eval.benchmarks.<key>.file); None: from data_dir
    backend_args: dict = field(default_factory=dict)
    arith: dict = field(default_factory=dict)
    verifier: dict | None = None
    protocol: str = "justrl"  # eval.protocol: the prompt and verifier style (EvalSection.protocol)
    worked_example: dict | None = None  # eval.worked_example: one worked exchange before each prompt
    stop: list[str] = field(default_factory=list)  # end-of-turn token strings (set from the tokenizer)
    stop_ids: list[int] = field(default_factory=list)  # their ids

    def gen_kwargs(self) -> dict:
        """lm-eval generation_kwargs: sampled, no top-k cut (vLLM's default; HF's default would be 50).

        Stops at every end-of-turn token: as stop strings (lm-eval cuts the text there) and as token ids, so that
        each sequence ends at its own stop token (HF ``eos_token_id``, vLLM ``stop_token_ids``) instead of running
        on until the whole batch is done (HF decodes with special tokens skipped, so a string cut alone misses it).
        """
        top_k = 0 if self.backend == "hf" else -1
        kwargs = {"until": list(self.stop), "do_sample": True, "temperature": self.temperature, "top_p": self.top_p,
                  "top_k": top_k, "max_gen_toks": self.max_new_tokens}
        if self.stop_ids:
            kwargs["eos_token_id" if self.backend == "hf" else "stop_token_ids"] = list(self.stop_ids)
        return kwargs
