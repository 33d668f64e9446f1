"""The ``eval`` section of a study: the evaluation protocol, over the paper's defaults.

``benchmarks`` and ``settings`` list what the study evaluates (the workflow plans one job per benchmark ×
setting); a benchmark or setting the section does not list falls back to the paper's (stapo.tasks.registry), so
``stapo eval`` can run any of them with any study file. A benchmark is data: a key the registry does not know
evaluates its own ``file`` (``{file: mine.jsonl, label: Mine, samples: 8}``), and any setting key may be declared
with its ``temperature`` and ``top_p``. ``hf: {batch_size: 4}`` keeps the other ``hf`` defaults.
``stapo eval`` resolves one (benchmark, setting) job from the section (stapo.eval.evaluate.resolve_config), the command
line overriding it.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field

from stapo.core.fields import Choice, check_fields, check_keys, option
from stapo.core.limits import MAX_KEY_CHARS

from stapo.tasks.problems import DEFAULT_EVAL_PROTOCOL, EvalProtocol, check_worked_example
from stapo.tasks.registry import ARITH_DEFAULTS, BENCHMARKS, FILE_SAMPLES, SETTINGS

__all__ = ["EvalSection", "EvalConfig", "BenchmarkEntry", "Backend", "VERIFIER_DEFAULTS", "VERIFIER_KEYS",
           "check_verifier_config"]



class Backend(Choice):
    """``eval.backend``: lm-eval's model backend, and how each generates.

    hf    transformers (CPU and tests): one sampling seed per row (``seeding``), stops through ``eos_token_id``,
          no top-k cut spelled top_k 0
    vllm  vLLM (GPU; the paper's): a seed per request, stops through ``stop_token_ids``, no top-k cut spelled -1
    """

    HF = "hf"
    VLLM = "vllm"

    @property
    def seeding(self) -> str:
        """How stapo.eval.generation.ResumableLM makes the backend's sampling resumable-deterministic."""
        return "row" if self is Backend.HF else "request"

    @property
    def stop_ids_kwarg(self) -> str:
        """The generation kwarg that stops each sequence at its own end-of-turn token ids."""
        return "eos_token_id" if self is Backend.HF else "stop_token_ids"

    @property
    def no_top_k(self) -> int:
        """The top_k value that means "no top-k cut" (HF's default would be 50)."""
        return 0 if self is Backend.HF else -1

VERIFIER_DEFAULTS = {
    "model": "opencompass/CompassVerifier-3B",
    "max_new_tokens": 16,  # the reply is one letter (the card's example allows 2048 for its CoT prompt)
    "backend_args": {},  # merged over eval.<backend> for the verifier's engine (e.g. gpu_memory_utilization)
}
VERIFIER_KEYS = set(VERIFIER_DEFAULTS)


@dataclass(frozen=True)
class BenchmarkEntry:
    """One entry of ``eval.benchmarks`` (null: the paper's settings of a shipped benchmark)."""

    file: str | None = option(None, "the benchmark's own jsonl (rows id, problem, answer; a path relative to the "
                              "working directory): required for a key stapo.tasks.registry does not ship; for a "
                              "shipped one it replaces eval.data_dir's file", minLength=1)
    label: str | None = option(None, "what tables and figures show (default: the registry's label, else the key)",
                               minLength=1)
    samples: int | None = option(None, "N samples per problem (avg@N); null = the paper's N for a shipped benchmark, "
                                 "else FILE_SAMPLES (4)", minimum=1)
    limit: int | None = option(None, "evaluate only the first N problems (overrides eval.limit)", minimum=1)
    max_new_tokens: int | None = option(None, "response budget (overrides eval.max_new_tokens)", minimum=1)
    n: int | None = option(None, "arith only: number of generated problems (stapo.tasks.problems.synthetic_arith_rows)",
                           minimum=1)
    seed: int | None = option(None, "arith only: the generator's seed")
    difficulty: int | None = option(None, "arith only: operand digits", minimum=1)

    @property
    def arith(self) -> dict:
        """The arith generator's options given here."""
        return {k: getattr(self, k) for k in ARITH_DEFAULTS if getattr(self, k) is not None}


@dataclass(frozen=True)
class EvalSection:
    """The ``eval`` section: the evaluation protocol (benchmarks x sampling settings, grading, backend)."""

    backend: Backend = option(Backend.VLLM, "vllm (GPU; the paper's) or hf (transformers; CPU and tests), through "
                              "lm-eval")
    data_dir: str | None = option(None, "where benchmark rows come from: null / bundled (the files in "
                                  "stapo/tasks/data), hub, or a directory of <benchmark>.jsonl files")
    max_new_tokens: int = option(20480, "response budget in tokens (paper 20,480)", minimum=1)
    limit: int | None = option(None, "evaluate only the first N problems of each benchmark (null = all)", minimum=1)
    benchmarks: dict = option(
        help="the benchmarks evaluated: key -> BenchmarkEntry (a shipped benchmark of stapo.tasks.registry, or any "
        "key with its own file; default all shipped ones)",
        default_factory=lambda: {k: BenchmarkEntry() for k in BENCHMARKS},
        type="object", minProperties=1, propertyNames={"pattern": f"^[A-Za-z0-9_-]{{1,{MAX_KEY_CHARS}}}$(?!\\n)"})
    settings: dict = option(
        help="the sampling settings evaluated: key -> {temperature, top_p, label} (default the paper's two, "
        "stapo.tasks.registry.SETTINGS)", default_factory=lambda: copy.deepcopy(SETTINGS), minProperties=1)
    hf: dict = option(help="lm-eval hf model arguments (CPU defaults: batch_size 8, dtype float32; a mapping here "
                      "keeps the other defaults)", default_factory=lambda: {"batch_size": 8, "dtype": "float32"})
    vllm: dict = option(help="lm-eval vllm model arguments over the device's defaults "
                        "(stapo.vllm_settings.eval_engine_args)", default_factory=dict)
    verifier: dict | None = option(None, "the LLM-verifier stage (stapo.eval.verifier), e.g. {model: "
                                   "opencompass/CompassVerifier-3B} (keys of VERIFIER_DEFAULTS); null = rule grading "
                                   "only")
    protocol: EvalProtocol = option(
        DEFAULT_EVAL_PROTOCOL,
        "how the prompt, the rule stage, the gold and the verifier's inputs and verdicts are made. justrl "
        "(default, the paper's: JustRL's code, thunlp/JustRL @ cf444e9 evals/gen_vllm.py, grade.py, utils.py): the "
        "problem and the \\boxed{} instruction joined by one space in the chat template; the rule stage is JustRL's "
        "grade_answer_verl (stapo.tasks.justrl_grading) against JustRL's gold strings (answer_raw, else answer); the "
        "verifier gets an empty question and that gold, and only a reply that is exactly A counts. harness: a blank "
        "line between problem and instruction; the strict final box by math-verify against the clean answer; the "
        "verifier sees the problem and its reply is parsed leniently (stapo.eval.verifier.parse_verdict). Both rule "
        "stages' verdicts are in every per-sample record; recorded in each summary's generation block and part of "
        "the generation cache's key (stapo.tasks.problems.EvalProtocol)")
    worked_example: dict | None = option(
        None, "{problem, solution}: one worked exchange shown before every problem's prompt "
              "(stapo.tasks.problems.build_prompt; "
        "the CPU miniature's model writes \\boxed{} only when shown how); null (the paper) = none. Recorded in each "
        "summary's generation block and part of the generation cache's key")

    @classmethod
    def from_dict(cls, section: dict | None) -> "EvalSection":
        """The section merged over the defaults and validated (ValueError naming ``eval.<key>``)."""
        section = dict(section or {})
        check_keys(section, {f.name for f in dataclasses.fields(cls)}, "eval")
        base = cls()
        benchmarks = {} if "benchmarks" in section else dict(base.benchmarks)
        for key, entry in (section.pop("benchmarks", None) or {}).items():
            check_keys(entry or {}, {f.name for f in dataclasses.fields(BenchmarkEntry)}, f"eval.benchmarks.{key}")
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
        check_fields(self, "eval.")  # backend, protocol: their enums
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
        for key in (b.value for b in Backend):
            if not isinstance(getattr(self, key), dict):
                raise ValueError(f"eval.{key}: expected a mapping of lm-eval model arguments")
        check_verifier_config(self.verifier)
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
    check_keys(section, VERIFIER_KEYS, "eval.verifier")
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
    (stapo.eval.evaluate.resolve_config); the summary's ``generation`` block records them."""

    benchmark: str
    setting: str
    temperature: float
    top_p: float
    max_new_tokens: int
    n: int
    backend: Backend
    limit: int | None
    data_dir: str | None
    seed: int
    file: str | None = None  # the benchmark's own jsonl (eval.benchmarks.<key>.file); None: from data_dir
    backend_args: dict = field(default_factory=dict)
    arith: dict = field(default_factory=dict)
    verifier: dict | None = None
    protocol: EvalProtocol = DEFAULT_EVAL_PROTOCOL  # eval.protocol (EvalSection.protocol)
    worked_example: dict | None = None  # eval.worked_example: one worked exchange before each prompt
    stop: list[str] = field(default_factory=list)  # end-of-turn token strings (set from the tokenizer)
    stop_ids: list[int] = field(default_factory=list)  # their ids

    def gen_kwargs(self) -> dict:
        """lm-eval generation_kwargs: sampled, no top-k cut (vLLM's default; HF's default would be 50).

        Stops at every end-of-turn token: as stop strings (lm-eval cuts the text there) and as token ids, so that
        each sequence ends at its own stop token (HF ``eos_token_id``, vLLM ``stop_token_ids``) instead of running
        on until the whole batch is done (HF decodes with special tokens skipped, so a string cut alone misses it).
        """
        kwargs = {"until": list(self.stop), "do_sample": True, "temperature": self.temperature, "top_p": self.top_p,
                  "top_k": self.backend.no_top_k, "max_gen_toks": self.max_new_tokens}
        if self.stop_ids:
            kwargs[self.backend.stop_ids_kwarg] = list(self.stop_ids)
        return kwargs
