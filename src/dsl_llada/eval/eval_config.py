"""Typed evaluation configuration: models, named methods (sampler + config), tasks with their datasets, NFE grid,
seeds. JSON round-trippable (``EvalConfig.from_dict(cfg.to_dict()) == cfg``); validated on construction, so a bad
value fails before any model is loaded.

A preset (YAML or JSON) looks like::

    models:  [{name: dsl, path: /models/DSL-LLaDA}, {name: llada, path: /models/LLaDA-8B-Instruct}]
    methods: [{name: DSL-SDE, model: dsl, preset: dsl-sde}, {name: LLaDA, model: llada, preset: llada}]
    tasks:   [{name: summarization, datasets: [{name: xsum, path: data/summ_xsum.jsonl}]}]
    nfe: [8, 16, 32, 64]
    seeds: [42]
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

from ..config import BLOCK_SDE, ConfigBase, ConfigError, _check, read_config_file  # one validation helper
from ..core.model_source import DTypeName, ModelSource
from ..overrides import apply_overrides
from ..artifacts.atomic import atomic_write_text

TASK_NAMES = ("generation", "summarization", "reasoning", "correction", "probes", "walltime")
MODEL_KINDS = ("diffusion", "causal-lm")
SCORING_MODES = ("default", "authors")


def _name_ok(name: Any, what: str) -> None:
    _check(isinstance(name, str) and name.strip() != "" and "|" not in name and "\n" not in name,
           f"{what} name {name!r} must be a non-empty string without '|' or newlines")


@dataclass(frozen=True)
class ModelSpec(ConfigBase):
    """One model folder the methods refer to by name."""

    name: str
    """Short name methods use in their `model` field."""
    path: str
    """Local checkpoint folder: a DSL checkpoint, a LLaDA/Dream/HF backbone, or (kind 'causal-lm') any HF causal LM."""
    tokenizer: str | None = None
    """Tokenizer folder (default: the model folder)."""
    kind: Literal["diffusion", "causal-lm"] = "diffusion"
    """'diffusion': loaded by dsl_llada (DSL checkpoint or masked-diffusion backbone); 'causal-lm': an autoregressive
    Hugging Face model for the AR baseline (transformers AutoModelForCausalLM, no remote code)."""
    gguf_file: str | None = None
    """causal-lm only: a GGUF file name inside `path` (transformers' gguf_file loading)."""
    dtype: str | None = None
    """'float32' / 'bfloat16' / 'float16'; None or 'auto' = `loading.auto_dtype` (bf16 on CUDA and on a CPU with
    native bf16, else fp32)."""
    quantize: Literal["none", "int8"] = "none"
    """diffusion only: as ModelSource.quantize ('int8': weight-only int8 backbone linear layers)."""
    assume_released: bool = False
    """diffusion only: as ModelSource.assume_released (a DSL checkpoint without dsl_config.json is the released
    DSL-LLaDA layout; without it such a checkpoint is refused)."""

    def __post_init__(self) -> None:
        _name_ok(self.name, "model")
        _check(isinstance(self.path, str) and self.path != "", f"model {self.name!r}: path must be a folder, got {self.path!r}")
        _check(self.kind in MODEL_KINDS, f"model {self.name!r}: kind={self.kind!r} is not valid; expected one of {list(MODEL_KINDS)}")
        _check(self.gguf_file is None or self.kind == "causal-lm", f"model {self.name!r}: gguf_file needs kind 'causal-lm'")
        _check(self.kind == "diffusion" or (self.quantize == "none" and not self.assume_released),
               f"model {self.name!r}: quantize and assume_released apply to kind 'diffusion' only")
        try:
            self.source()  # the ModelSource checks (dtype, quantize, assume_released), named after this entry
        except ConfigError as e:
            raise ConfigError(f"model {self.name!r}: {e}") from None

    def source(self, device: str | None = None) -> ModelSource:
        """How `loading.open_model` opens this entry (diffusion models)."""
        return ModelSource(path=self.path, tokenizer=self.tokenizer, device=device,
                           dtype=cast(DTypeName, self.dtype or "auto"), quantize=self.quantize,
                           assume_released=self.assume_released)

    def to_dict(self) -> dict[str, Any]:
        """As stored in a run's eval_run.json; `quantize` and `assume_released` only when set, so runs stored before
        they existed still resume."""
        out = super().to_dict()
        for key, default in (("quantize", "none"), ("assume_released", False)):
            if out[key] == default:
                del out[key]
        return out


@dataclass(frozen=True)
class DatasetSpec(ConfigBase):
    """One data file of a task (JSONL, or a JSON list of objects); fields are looked up by name."""

    name: str
    """Name used in work-item keys and tables (e.g. 'xsum', 'gsm8k_100')."""
    path: str
    """The data file. The package ships no data: point at your own copy (e.g. data/summ_xsum.jsonl)."""
    kind: str | None = None
    """Protocol variant: summarization 'xsum'|'cnndm'|'pubmed'|'arxiv'; reasoning 'gsm8k'|'math'; generation
    'prompts'|'prefix'. None = inferred from `name`/`path`."""
    limit: int | None = None
    """Use at most this many rows (after `offset`); None = all."""
    offset: int = 0
    """Skip this many rows first."""
    gen_length: int | None = None
    """Response length in tokens; None = the protocol's default for this kind (XSum 128, others 256)."""
    fields: dict[str, str] = field(default_factory=dict)
    """Field-name overrides, e.g. {'prompt': 'question', 'reference': 'summary', 'id': 'uid'}."""
    template: str | None = None
    """Prompt template with '{text}' applied to the `text` field when a row has no ready prompt (None = protocol's)."""

    def __post_init__(self) -> None:
        _name_ok(self.name, "dataset")
        _check(isinstance(self.path, str) and self.path != "", f"dataset {self.name!r}: path must be a file, got {self.path!r}")
        _check(self.limit is None or (isinstance(self.limit, int) and self.limit >= 1),
               f"dataset {self.name!r}: limit={self.limit!r} must be an int >= 1 or null")
        _check(isinstance(self.offset, int) and self.offset >= 0, f"dataset {self.name!r}: offset={self.offset!r} must be >= 0")
        _check(self.gen_length is None or (isinstance(self.gen_length, int) and self.gen_length >= 1),
               f"dataset {self.name!r}: gen_length={self.gen_length!r} must be an int >= 1 or null")
        _check(isinstance(self.fields, dict) and all(isinstance(v, str) for v in self.fields.values()),
               f"dataset {self.name!r}: fields must map role -> field name, got {self.fields!r}")
        _check(self.template is None or "{text}" in self.template,
               f"dataset {self.name!r}: template must contain '{{text}}', got {self.template!r}")


METHOD_PRESETS = ("dsl-sde", BLOCK_SDE, "llada", "llada-eos", "llada-block", "llada-star", "remdm", "dsl-remask",
                  "dsl-remask-eos", "dsl-remask-block", "ar")


@dataclass(frozen=True)
class MethodSpec(ConfigBase):
    """A named inference method: a model and a sampler preset (paper's method definitions) plus overrides."""

    name: str
    """Row label in tables (e.g. 'DSL-LLaDA-SDE', 'LLaDA*')."""
    model: str
    """Name of a ModelSpec."""
    preset: str
    """One of METHOD_PRESETS: dsl-sde (Heun SDE), block-sde, llada (low-confidence remasking, one block), llada-eos
    (EOS logit -inf), llada-block (block 32), llada-star (EOS + block 32), remdm (ReMDM-conf-loop), dsl-remask[-eos|
    -block] (discrete remasking on the DSL model), ar (greedy decoding of a causal LM)."""
    options: dict[str, Any] = field(default_factory=dict)
    """Overrides of the sampler config fields (SDEConfig / RemaskConfig), e.g. {'block_length': 8, 'eta': 0.0}."""
    nfe: tuple[int, ...] | None = None
    """This method's own NFE grid (None = the config's). Block SDE counts NFE as (L/B)(2S+1) forward passes."""

    def __post_init__(self) -> None:
        _name_ok(self.name, "method")
        _check(self.preset in METHOD_PRESETS, f"method {self.name!r}: preset={self.preset!r} is not valid; "
                                              f"expected one of {list(METHOD_PRESETS)}")
        _check(isinstance(self.options, dict), f"method {self.name!r}: options must be a mapping")
        if self.nfe is not None:
            _check(len(self.nfe) > 0 and all(isinstance(n, int) and n >= 1 for n in self.nfe),
                   f"method {self.name!r}: nfe={list(self.nfe)!r} must be a non-empty list of ints >= 1")


@dataclass(frozen=True)
class TaskSpec(ConfigBase):
    """One task family with its datasets and options."""

    name: str
    """One of TASK_NAMES."""
    datasets: tuple[DatasetSpec, ...] = ()
    """The data files this task runs on."""
    methods: tuple[str, ...] | None = None
    """Run only these method names on this task (None = every method that can run it)."""
    options: dict[str, Any] = field(default_factory=dict)
    """Task options, e.g. generation {'scorer': {'path': ..., 'gguf_file': ...}}; summarization {'baseline': 'LLaDA',
    'bertscore': {'model_dir': ..., 'num_layers': 6}}."""

    def __post_init__(self) -> None:
        _check(self.name in TASK_NAMES, f"task {self.name!r} is not valid; expected one of {list(TASK_NAMES)}")
        _check(len(self.datasets) > 0, f"task {self.name!r} has no datasets; give at least one {{name, path}}")
        names = [d.name for d in self.datasets]
        _check(len(set(names)) == len(names), f"task {self.name!r}: duplicate dataset names {names}")
        _check(isinstance(self.options, dict), f"task {self.name!r}: options must be a mapping")


@dataclass(frozen=True)
class EvalConfig(ConfigBase):
    """A whole evaluation: what runs (models x methods x tasks x NFE x seeds) and how it is batched."""

    models: tuple[ModelSpec, ...] = ()
    """Model folders, referred to by name."""
    methods: tuple[MethodSpec, ...] = ()
    """Named methods (sampler + config)."""
    tasks: tuple[TaskSpec, ...] = ()
    """Tasks with their datasets."""
    nfe: tuple[int, ...] = (64,)
    """NFE grid (SDE: solver evaluations; discrete: steps; Block SDE: (L/B)(2S+1))."""
    seeds: tuple[int, ...] = (42,)
    """Seeds; sample i of a dataset uses a generator seeded seed + i (independent of batching and sharding)."""
    batch_size: int = 8
    """Prompts per sampler call (length-bucketed). Part of the run's identity: padding can change float rounding."""
    device: str | None = None
    """'cpu', 'cuda'; None = the process's accelerator (one per rank under accelerate) or CPU."""
    chat_template: bool = True
    """Wrap prompts in the tokenizer's chat template (prefix-continuation datasets never are)."""
    scoring_mode: Literal["default", "authors"] = "default"
    """'default' = correct metrics; 'authors' = the authors' scoring code, flaws included (to compare with the paper)."""

    def __post_init__(self) -> None:
        _check(len(self.models) > 0, "the config has no models; give at least one {name, path}")
        _check(len(self.methods) > 0, "the config has no methods; give at least one {name, model, preset}")
        _check(len(self.tasks) > 0, f"the config has no tasks; give at least one of {list(TASK_NAMES)}")
        mnames = [m.name for m in self.models]
        _check(len(set(mnames)) == len(mnames), f"duplicate model names {mnames}")
        names = [m.name for m in self.methods]
        _check(len(set(names)) == len(names), f"duplicate method names {names}")
        tnames = [t.name for t in self.tasks]
        _check(len(set(tnames)) == len(tnames), f"duplicate task names {tnames}; put all datasets of a task in one entry")
        models = {m.name: m for m in self.models}
        for m in self.methods:
            _check(m.model in models, f"method {m.name!r}: model={m.model!r} is not one of the models {mnames}")
            want = "causal-lm" if m.preset == "ar" else "diffusion"
            _check(models[m.model].kind == want, f"method {m.name!r}: preset {m.preset!r} needs a model of kind {want!r}, "
                                                 f"but {m.model!r} is {models[m.model].kind!r}")
        for t in self.tasks:
            for n in t.methods or ():
                _check(n in names, f"task {t.name!r}: method {n!r} is not one of {names}")
        _check(len(self.nfe) > 0 and all(isinstance(n, int) and n >= 1 for n in self.nfe),
               f"nfe={list(self.nfe)!r} must be a non-empty list of ints >= 1")
        _check(len(self.seeds) > 0 and all(isinstance(s, int) and s >= 0 for s in self.seeds),
               f"seeds={list(self.seeds)!r} must be a non-empty list of ints >= 0")
        _check(isinstance(self.batch_size, int) and self.batch_size >= 1, f"batch_size={self.batch_size!r} must be >= 1")
        _check(self.scoring_mode in SCORING_MODES,
               f"scoring_mode={self.scoring_mode!r} is not valid; expected one of {list(SCORING_MODES)}")

    # nested tuples of specs: ConfigBase handles single nested configs only
    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out["models"] = [m.to_dict() for m in self.models]
        out["methods"] = [m.to_dict() for m in self.methods]
        out["tasks"] = [{**t.to_dict(), "datasets": [d.to_dict() for d in t.datasets]} for t in self.tasks]
        return json.loads(json.dumps(out))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EvalConfig:
        _check(isinstance(data, dict), f"an evaluation config must be a mapping, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        _check(not unknown, f"unknown EvalConfig field(s) {unknown}; valid fields: {sorted(known)}")
        d = dict(data)

        def specs(key: str, kind: type, items: Any) -> tuple:
            _check(isinstance(items, list), f"{key} must be a list, got {type(items).__name__}")
            out = []
            for i, item in enumerate(items):
                _check(isinstance(item, dict), f"{key}[{i}] must be a mapping, got {item!r}")
                out.append(_spec(kind, item, f"{key}[{i}]"))
            return tuple(out)

        if "models" in d:
            d["models"] = specs("models", ModelSpec, d["models"])
        if "methods" in d:
            d["methods"] = specs("methods", MethodSpec, d["methods"])
        if "tasks" in d:
            tasks = []
            _check(isinstance(d["tasks"], list), "tasks must be a list")
            for i, t in enumerate(d["tasks"]):
                _check(isinstance(t, dict), f"tasks[{i}] must be a mapping, got {t!r}")
                t = dict(t)
                t["datasets"] = specs(f"tasks[{i}].datasets", DatasetSpec, t.get("datasets", []))
                tasks.append(_spec(TaskSpec, t, f"tasks[{i}]"))
            d["tasks"] = tuple(tasks)
        for k in ("nfe", "seeds"):
            if isinstance(d.get(k), list):
                d[k] = tuple(d[k])
            elif isinstance(d.get(k), int):
                d[k] = (d[k],)
        return cls(**d)

    def method(self, name: str) -> MethodSpec:
        return next(m for m in self.methods if m.name == name)

    def model(self, name: str) -> ModelSpec:
        return next(m for m in self.models if m.name == name)

    def task_methods(self, task: TaskSpec) -> list[MethodSpec]:
        wanted = task.methods
        return [m for m in self.methods if wanted is None or m.name in wanted]

    def method_nfes(self, method: MethodSpec) -> tuple[int, ...]:
        if method.preset == "ar":
            return (0,)  # greedy AR decoding has no NFE knob: one row per dataset, NFE shown as 0
        return method.nfe if method.nfe is not None else self.nfe

    def save(self, path: str | Path) -> None:
        atomic_write_text(Path(path), json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")


def _spec(kind: type, data: dict[str, Any], where: str):
    names = {f.name for f in dataclasses.fields(kind)}
    unknown = sorted(set(data) - names)
    _check(not unknown, f"{where}: unknown field(s) {unknown}; valid fields: {sorted(names)}")
    data = dict(data)
    for f in dataclasses.fields(kind):
        if isinstance(data.get(f.name), list) and f.name in ("nfe", "methods"):
            data[f.name] = tuple(data[f.name])
    try:
        return kind(**data)
    except TypeError as e:
        raise ConfigError(f"{where}: {e}") from None


def load_eval_config(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> EvalConfig:
    """An EvalConfig from a YAML/JSON preset plus dotted overrides. Relative data/model paths stay as written
    (they resolve against the working directory at run time)."""
    data: dict[str, Any] = {} if path is None else read_config_file(path, "evaluation")
    return EvalConfig.from_dict(apply_overrides(data, list(overrides), example="batch_size=4 or nfe=[8,16]"))


def config_diff(old: Any, new: Any, prefix: str = "") -> list[str]:
    """Dotted names of the fields that differ between two config dicts (lists compared element-wise; any other
    values compared as they are)."""
    out: list[str] = []
    if isinstance(old, dict) and isinstance(new, dict):
        for k in sorted(set(old) | set(new)):
            out += config_diff(old.get(k), new.get(k), f"{prefix}{k}.")
        return out
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new) and \
            all(isinstance(x, dict) for x in old + new):
        for i, (a, b) in enumerate(zip(old, new)):
            label = a.get("name", i) if a.get("name") == b.get("name") else i
            out += config_diff(a, b, f"{prefix}{label}.")
        return out
    return [] if old == new else [prefix.rstrip(".")]
