"""Typed configuration: one dataclass per concern, validated on construction, JSON round-trippable.

Every artifact (checkpoint, sample file, report) stores the config that produced it, and
``Config.from_dict(cfg.to_dict()) == cfg`` holds for every config here.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar, cast

from .errors import ConfigError as ConfigError  # re-exported: the configs' one error type, imported from here package-wide
from .snr import ScheduleName, check_schedule, snr_schedule
from .artifacts.atomic import atomic_write_text

C = TypeVar("C", bound="ConfigBase")


def _check(cond: bool, msg: str) -> None:
    """Raise ConfigError(msg) unless `cond` (the one validation helper of every config, train/ included)."""
    if not cond:
        raise ConfigError(msg)


def read_config_file(path: str | Path, what: str) -> dict[str, Any]:
    """The mapping in a YAML or JSON preset file (by suffix); one clear error for a missing file, a parse error or
    a document that is not a mapping. `what` names the config in messages (e.g. 'training', 'evaluation')."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{what} config {str(p)!r} does not exist")
    text = p.read_text()
    if p.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{p} is not valid JSON: {e}") from None
    else:
        import yaml

        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{p} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p} must hold a mapping of {what} config fields, got {type(data).__name__}")
    return data


def _choice(name: str, value: Any, allowed: tuple[Any, ...]) -> None:
    _check(value in allowed, f"{name}={value!r} is not valid; expected one of {list(allowed)}")


# -- numeric bounds of the sampler settings ------------------------------------------------------------------------
# Each bound below is derived from the arithmetic it protects (the samplers' states, logits and guidance run in
# float32; the Gumbel-max proposal in float64). `docs/reliability.md` lists them with their reasons.
FP32_MAX = 3.4028234663852886e38
"""Largest finite float32."""
FP32_TINY = 1.1754943508222875e-38
"""Smallest normal float32: the samplers flush denormals, so a smaller SNR becomes 0 and 1/gamma infinite."""
FP32_EPS = 1.1920928955078125e-07
"""float32 machine epsilon, 2^-23."""
FP64_MAX = 1.7976931348623157e308
MAX_HEUN_RATIO = 1.0 / FP32_EPS
"""Largest gamma_{s+1}/gamma_s of one Heun step: the corrector's v_s + v_e cancels two terms of size |ê - y|/gamma_s
down to a remainder of size 1/gamma_{s+1}; fp32 rounds those terms to within eps/gamma_s, so past a ratio of
1/eps (2^23) the rounding error exceeds the step's result and the schedule has degenerated."""
MAX_NFE = 65536
"""Upper bound of nfe (SDE) and steps (remasking): every unit is a full forward pass over prompt + response, and
the schedule is held in memory; the paper uses at most 256 (256x less)."""
MAX_GEN_LENGTH = 131072
"""Upper bound of gen_length before a model is known (the run itself also checks prompt + gen_length against the
model's context): 128k tokens, the longest context of the backbone families supported (Llama 3.1 / Qwen2.5)."""
GUMBEL_MAX_ABS = 37.0
"""|log(-log U)| for float64 U in [2^-53, 1): at most ln(53 ln 2) = 3.6 above and ln(2^-53) = -36.7 below."""
MAX_CFG_SCALE = 2.0 ** 24
"""Past (s+1) = 2^24 the unconditional logits' share of un + (s+1)(cond - un) is below fp32 resolution (2^-24
relative): a larger scale only rescales the same ranking, and brings the guided logits closer to overflow."""
RANDN_MAX_ABS = 6.0
"""|xi| of a float32 normal draw (Box-Muller on float32 uniforms >= 2^-24): at most sqrt(2*24*ln 2) = 5.77."""


def check_number(name: str, value: Any, *, lo: float | None = None, hi: float | None = None, lo_open: bool = False,
                 reason: str = "", integer: bool = False) -> None:
    """ConfigError unless `value` is a (finite) real number in the range; the message states the range and why."""
    kind = "an int" if integer else "a finite number"
    ok_type = (isinstance(value, int) if integer else isinstance(value, (int, float))) and not isinstance(value, bool)
    if ok_type and not integer:
        ok_type = math.isfinite(value)
    lo_txt = "" if lo is None else (f"> {lo:g}" if lo_open else f">= {lo:g}")
    hi_txt = "" if hi is None else f"<= {hi:g}"
    rng = " and ".join(t for t in (lo_txt, hi_txt) if t)
    why = f" ({reason})" if reason else ""
    if not ok_type:
        raise ConfigError(f"{name}={value!r} is not valid: it must be {kind}{' ' + rng if rng else ''}{why}")
    if (lo is not None and (value <= lo if lo_open else value < lo)) or (hi is not None and value > hi):
        raise ConfigError(f"{name}={value!r} is out of range: it must be {rng}{why}")


class ConfigBase:
    """Mixin: dict/JSON round trip for (possibly nested) config dataclasses."""

    _nested: ClassVar[dict[str, type]] = {}

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            v = getattr(self, f.name)
            if isinstance(v, ConfigBase):
                v = v.to_dict()
            elif isinstance(v, tuple):
                v = list(v)
            out[f.name] = v
        return out

    @classmethod
    def from_dict(cls: type[C], data: dict[str, Any]) -> C:
        names = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(data) - set(names))
        if unknown:
            raise ConfigError(f"unknown {cls.__name__} field(s) {unknown}; valid fields: {sorted(names)}")
        kwargs: dict[str, Any] = {}
        for k, v in data.items():
            sub = cls._nested.get(k)
            if sub is not None and isinstance(v, dict) and issubclass(sub, ConfigBase):
                v = sub.from_dict(v)
            elif isinstance(v, list) and isinstance(names[k].default, tuple):
                v = tuple(v)
            kwargs[k] = v
        return cls(**kwargs)

    def replace(self: C, **changes: Any) -> C:
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def save(self, path: str | Path) -> None:
        atomic_write_text(Path(path), self.to_json() + "\n")

    @classmethod
    def load(cls: type[C], path: str | Path) -> C:
        return cls.from_dict(json.loads(Path(path).read_text()))


@dataclass(frozen=True)
class ConverterConfig(ConfigBase):
    """The noise embedding and the softmax converter h = softmax(beta * z K^T + b) W + c."""

    noise_dim: int = 100
    """d, the dimension of the unit-sphere noise embedding (paper: 100; authors' code default 48)."""
    noise_init: Literal["random", "pca"] = "random"
    """'random': iid N(0, I) rows normalised to unit norm; 'pca': top-d PCA directions of the centred wte."""
    noise_seed: int = 42
    """Seed of the generator used for the random noise-embedding init (all ranks agree)."""
    trainable_noise_embed: bool = True
    """Paper: trainable, re-normalised to the unit sphere in every forward. False = authors' frozen embedding."""
    layout: Literal["released", "paper"] = "released"
    """'released': mask-slot key is a fixed zero row, mask logit bias starts at ln V, value bias c present
    (the published DSL-LLaDA checkpoints). 'paper': a learned, trainable mask key row (initialised to zeros,
    so the start is identical to 'released') and no value bias."""
    beta_init: float = 1.0
    """Initial converter sharpness beta (paper primary model: 1.0; authors' code default 5.0)."""
    value_bias_init: Literal["zeros", "torch_default"] = "zeros"
    """Init of the value bias c (released layout only): 'torch_default' = U(+-1/sqrt(V+1)) as the authors."""
    residual: bool = False
    """Enable the optional residual ('Highpass') path W_r z_high + b_r of the released Highpass checkpoint."""
    token_chunk: int = 256
    """Tokens per chunk of the fp32 (V+1)-way softmax; bounds memory at large V and L (0 = no chunking)."""
    checkpoint_chunks: bool = True
    """Under autograd, recompute each chunk's softmax in backward instead of storing (B*L, V+1) probabilities."""

    def __post_init__(self) -> None:
        # The noise embedding is (V + 1) x noise_dim: 8192 already makes it 4 GB for LLaDA's 126k vocabulary.
        _check(isinstance(self.noise_dim, int) and not isinstance(self.noise_dim, bool) and 1 <= self.noise_dim <= 8192,
               f"noise_dim={self.noise_dim!r} must be an int in [1, 8192] (the paper uses 100)")
        _check(isinstance(self.noise_seed, int) and 0 <= self.noise_seed < 2**63,
               f"noise_seed={self.noise_seed!r} must be an int in [0, 2**63)")
        _choice("noise_init", self.noise_init, ("random", "pca"))
        _choice("layout", self.layout, ("released", "paper"))
        _choice("value_bias_init", self.value_bias_init, ("zeros", "torch_default"))
        _check(math.isfinite(self.beta_init) and self.beta_init > 0, f"beta_init={self.beta_init!r} must be a finite float > 0")
        _check(self.token_chunk >= 0, f"token_chunk={self.token_chunk!r} must be >= 0 (0 disables chunking)")


@dataclass(frozen=True)
class DSLConfig(ConfigBase):
    """Everything that defines a DSL model besides the backbone weights; saved as `dsl_config.json`."""

    converter: ConverterConfig = field(default_factory=ConverterConfig)
    """Converter and noise-embedding settings."""
    context_embedding: Literal["converter", "wte"] = "converter"
    """Clean context/committed positions: 'converter' = the converter's value column W[:, c] (+ c bias), as the
    paper's Algorithm 2 (W_backbone[c_i]); 'wte' = the backbone's original input embedding (authors' code)."""
    backbone_type: str | None = None
    """Family of the backbone the converter belongs to ('llada', 'dream', 'hf': `Backbone.family`). None = taken
    from the backbone when a DSLModel is built; a checkpoint whose backbone is of another family is refused."""

    _nested: ClassVar[dict[str, type]] = {"converter": ConverterConfig}

    def __post_init__(self) -> None:
        _choice("context_embedding", self.context_embedding, ("converter", "wte"))
        _check(self.backbone_type is None or (isinstance(self.backbone_type, str) and bool(self.backbone_type)),
               f"backbone_type={self.backbone_type!r} must be a backbone family name (e.g. 'llada', 'dream') or None")


SDE, BLOCK_SDE, REMASK, REMDM = "sde", "block-sde", "remask", "remdm"
"""The sampler names a config's `sampler_name` returns; the table of samplers is `dsl_llada.sampling.registry`."""

CacheMode = Literal["off", "prefix", "dual"]
CACHE_MODES: tuple[str, ...] = ("off", "prefix", "dual")


def check_cache_options(mode: str, refresh: object) -> None:
    """ConfigError unless `mode` is a cache mode and `refresh` an int >= 0 (the samplers' configs share it)."""
    _choice("kv_cache", mode, CACHE_MODES)
    _check(not isinstance(refresh, bool) and isinstance(refresh, int) and refresh >= 0,
           f"cache_refresh={refresh!r} must be an int >= 0 (0 = a full forward only at each block's start, "
           f"R = one every R model calls of a block)")


@dataclass(frozen=True)
class ForwardOptions(ConfigBase):
    """How a sampler runs its model forwards: approximate key/value caching and `torch.compile`. `SDEConfig` and
    `RemaskConfig` both end their own fields with these three (RemaskConfig then adds `threshold`)."""

    kv_cache: CacheMode = "off"
    """Approximate key/value caching (Fast-dLLM's prefix/dual cache; native LLaDA backbone): between full forwards,
    recompute only the current block ('dual') or it and everything after it ('prefix') and reuse the other
    positions' keys/values; 'off' (default) = exact. Costs and quality: docs/benchmarks/cpu-sampling.md."""
    cache_refresh: int = 0
    """With kv_cache: a full forward every R model calls of a block (1 = every call, exact); 0 = only at each
    block's first call."""
    compile: bool = False
    """Run the backbone forward through `torch.compile` (compiled on the first call and per new shape; remasking's
    head column count varies from step to step, so its second compile makes it dynamic). Worth it on a GPU, where
    the eager forward at small batches is launch-bound (docs/benchmarks/gpu.md), not on a small CPU job. Off by default;
    tokens are those of the eager model up to floating-point rounding."""

    def _check_forward_options(self) -> None:
        _check(isinstance(self.compile, bool), f"compile={self.compile!r} must be true or false")
        check_cache_options(self.kv_cache, self.cache_refresh)
        _check(self.kv_cache == "off" or not self.compile,
               f"compile=True with kv_cache={self.kv_cache!r} is not supported: the cached forward runs eagerly")


@dataclass(frozen=True)
class _SDEFields(ConfigBase):
    """The SDE sampler's own fields; `SDEConfig` puts `ForwardOptions`' after them."""

    nfe: int = 64
    """NFE N: model evaluations of the Heun solver per denoising window (the whole response, or one block of Block
    SDE), even; S = N/2 steps; forward passes per window = N + 1 (docs/samplers.md, "Accounting")."""
    gen_length: int = 256
    """Response length L in tokens."""
    schedule: ScheduleName = "sensitive"
    """'sensitive' (authors' floors: NFE <= 16 ends at gamma 74), 'paper-exact' (always ends at gamma_max), 'uniform'."""
    gamma_min: float = 0.01
    """First SNR of the schedule."""
    gamma_max: float = 100.0
    """Last SNR of the schedule."""
    eta: float | None = None
    """Stochastic scale; None = by NFE (0.10 <= 8, 0.05 <= 16, 0.01 <= 32, 0.005 otherwise); 0 = deterministic."""
    top_m: int = 512
    """Top-M tokens kept (renormalised) in the posterior-mean denoiser; 0 = full softmax."""
    beta_scale: float = 2.0
    """beta_inf = beta_scale * trained beta (paper 'inference converter multiplier' 2.0)."""
    beta_absolute: float | None = None
    """If set, beta_inf = this value regardless of the trained beta (authors' Block-SDE/registry scripts use 2.0)."""
    predictor_noise: bool = True
    """True (default; the authors' code, the sampler that produced the paper's numbers): the Euler predictor also
    gets g_s*dW and the corrector reuses the same dW, so the effective noise per step is (eta/gamma_{s+1})*dW.
    False = 'Algorithm 2 as printed' (noise only in the final update): 1/2 (eta/gamma_s + eta/gamma_{s+1})*dW,
    about 350x more at the first step 0.01 -> 7 (docs/samplers.md). Irrelevant when eta = 0."""
    truncate_at_eos: bool = True
    """Cut the response at the first EOS/EoT (paper). False keeps every position (authors decode with skip_special_tokens)."""
    block_length: int = 0
    """Block SDE: blocks of B tokens left to right (0 = whole response at once)."""
    converter_tolerance: float = 0.0
    """Sparse converter at inference: per position keep only the slots that hold all but < this much of the
    converter's softmax mass, renormalised, and gather those columns of W instead of the dense product
    (approximate; see docs/benchmarks/cpu-sampling.md for its deviation). 0 = the exact dense converter (what training uses)."""


@dataclass(frozen=True)
class SDEConfig(ForwardOptions, _SDEFields):
    """SDE/Heun sampler settings; defaults are the paper's evaluation settings (Appendix 'SDE Inference') run
    with the authors' sampler (noise in the Heun predictor, the code behind the paper's numbers)."""

    def __post_init__(self) -> None:
        self._check_forward_options()
        check_number("converter_tolerance", self.converter_tolerance, lo=0.0, hi=1.0,
                     reason="a share of the converter's softmax mass; 0 = exact dense converter, 1 excluded")
        _check(self.converter_tolerance < 1.0, f"converter_tolerance={self.converter_tolerance!r} must be in [0, 1) "
                                               f"(0 = exact dense converter)")
        check_number("nfe", self.nfe, lo=2, hi=MAX_NFE, integer=True,
                     reason="two model evaluations per Heun step, each a full forward pass; the paper uses at most 256")
        _check(self.nfe % 2 == 0, f"nfe={self.nfe!r} is not valid for the Heun sampler: it needs an even number >= 2 "
                                  f"(two model evaluations per step)")
        check_number("gen_length", self.gen_length, lo=1, hi=MAX_GEN_LENGTH, integer=True,
                     reason="the response must fit a model's context; the run checks it against the model's own")
        check_number("gamma_min", self.gamma_min, lo=FP32_TINY, reason="the smallest normal float32: the sampler "
                     "divides by gamma in float32 with denormals flushed, so a smaller SNR becomes 0")
        check_number("gamma_max", self.gamma_max, lo=0.0, lo_open=True, hi=FP32_MAX,
                     reason="the state gamma * ê (|ê| <= 1) must be finite in float32")
        check_schedule(self.schedule, self.gamma_min, self.gamma_max)
        grid = snr_schedule(self.schedule, self.steps, self.gamma_min, self.gamma_max).tolist()
        object.__setattr__(self, "_snr_grid", tuple(grid))  # built once here; `snr_grid` hands it out
        ratio, at = max((grid[s + 1] / grid[s], s) for s in range(len(grid) - 1))
        _check(ratio <= MAX_HEUN_RATIO,
               f"gamma_min={self.gamma_min!r}, gamma_max={self.gamma_max!r} with nfe={self.nfe} and "
               f"schedule={self.schedule!r} make Heun step {at} jump from gamma {grid[at]:.4g} to {grid[at + 1]:.4g} "
               f"(x{ratio:.3g}); a step may multiply gamma by at most 2^23 = {MAX_HEUN_RATIO:.4g} (1/float32 "
               f"epsilon: beyond it the corrector's cancellation is lost to rounding). Raise gamma_min or nfe")
        if self.eta is not None:
            noise = max((grid[s + 1] - grid[s]) ** 0.5 / grid[s] for s in range(len(grid) - 1))
            check_number("eta", self.eta, lo=0.0, hi=FP32_MAX / (RANDN_MAX_ABS * noise),
                         reason=f"None = by NFE, 0 = deterministic; the noise increment eta/gamma_s * sqrt(dgamma) * xi "
                                f"(|xi| <= {RANDN_MAX_ABS:g}) must be finite in float32 on this schedule")
        check_number("top_m", self.top_m, lo=0, integer=True, reason="0 = full softmax")
        check_number("beta_scale", self.beta_scale, lo=0.0, lo_open=True,
                     reason="beta_inf = beta_scale x the trained beta; the run checks beta_inf * gamma_max against "
                            "float32's range")
        if self.beta_absolute is not None:
            check_number("beta_absolute", self.beta_absolute, lo=0.0, lo_open=True, hi=FP32_MAX / self.gamma_max,
                         reason=f"the converter's logits beta * gamma * (ê . k), |ê . k| <= 1, must be finite in "
                                f"float32 up to gamma_max={self.gamma_max:g}")
        check_number("block_length", self.block_length, lo=0, integer=True, reason="0 = the whole response at once")
        if self.block_length:
            _check(self.gen_length % self.block_length == 0,
                   f"gen_length={self.gen_length} is not divisible by block_length={self.block_length}")

    @property
    def steps(self) -> int:
        return self.nfe // 2

    @property
    def snr_grid(self) -> tuple[float, ...]:
        """The increasing SNR grid of `steps` + 1 points this config integrates over (`snr.snr_schedule` of its
        schedule, steps, gamma_min and gamma_max), built once when the config is made: the checks above, the
        samplers and the step-level engine all read this one."""
        return cast(tuple[float, ...], self.__dict__["_snr_grid"])

    @property
    def sampler_name(self) -> str:
        """The method this config runs: 'block-sde' when block_length > 0, else 'sde'."""
        return BLOCK_SDE if self.block_length else SDE

    def resolved_eta(self) -> float:
        if self.eta is not None:
            return self.eta
        return eta_for_nfe(self.nfe)


def eta_for_nfe(nfe: int) -> float:
    """The paper's NFE-tied noise scale: 0.10 (<= 8), 0.05 (<= 16), 0.01 (<= 32), 0.005 otherwise."""
    if nfe <= 8:
        return 0.10
    if nfe <= 16:
        return 0.05
    if nfe <= 32:
        return 0.01
    return 0.005


@dataclass(frozen=True)
class _RemaskFields(ConfigBase):
    """The remasking sampler's own fields up to `truncate_at_eos`; `RemaskConfig` puts `ForwardOptions`' after them,
    then `threshold`."""

    steps: int = 64
    """Total denoising steps (= forward passes without CFG)."""
    gen_length: int = 256
    """Response length in tokens."""
    block_length: int = 0
    """Semi-autoregressive block length (0 = one block of gen_length; clamped to gen_length)."""
    remasking: Literal["low_confidence", "random"] = "low_confidence"
    """Which masked positions are committed each step."""
    temperature: float = 0.0
    """Gumbel-max sampling temperature in float64 (0 = greedy argmax)."""
    cfg_scale: float = 0.0
    """Classifier-free guidance: logits = un + (s+1)(cond - un) with the prompt masked in the unconditional copy."""
    eos_inf: bool = False
    """EOS logit set to -inf at every step ('LLaDA+EOS')."""
    eos_inf_include_eot: bool = False
    """Also block the end-of-turn token when eos_inf / suppression is on (authors block EOS only)."""
    eos_suppress_ratio: float = 0.0
    """Suppress EOS and EoT only during the first fraction of each block's steps (0 = off)."""
    remdm: bool = False
    """ReMDM-conf-loop remasking of already-committed tokens inside the loop window."""
    remdm_t_on: float = 0.55
    """ReMDM loop window start: re-masking runs while t_off < t <= t_on, t = 1 - i/S_b (paper: 0.55)."""
    remdm_t_off: float = 0.05
    """ReMDM loop window end (paper: 0.05)."""
    remdm_alpha_loop: float = 0.9
    """ReMDM loop alpha: re-mask budget per step sigma_max = min(1, (1 - alpha) / alpha) (paper: 0.9)."""
    remdm_authors_quota: bool = False
    """Reproduce the authors' flaw: keep the original quota so remasked tokens can stay masked at the end."""
    remdm_confidence: Literal["committed", "argmax"] = "committed"
    """ReMDM uncertainty u = 1 - conf: 'committed' = probability of the token committed at the position (fix);
    'argmax' = probability of the sampler's current proposal there (authors' code; the argmax at temperature 0)."""
    truncate_at_eos: bool = True
    """Cut the response at the first EOS/EoT."""


@dataclass(frozen=True)
class RemaskConfig(ForwardOptions, _RemaskFields):
    """LLaDA `generate()`-style discrete remasking (and ReMDM when `remdm=True`)."""

    threshold: float | None = None
    """Confidence-threshold parallel decoding (Fast-dLLM's rule; low_confidence remasking only): each step also
    commits every masked position of the block whose confidence exceeds this value, on top of the linear schedule
    (recomputed from the masks left), and a block ends as soon as no mask is left, so the number of forward passes
    is data-dependent (at most `steps`; with steps = gen_length each step commits at least the most confident
    position, Fast-dLLM's setting). None (default) = the fixed schedule. 1 is never exceeded (the fixed schedule);
    near 0 a block is committed in one pass."""

    def __post_init__(self) -> None:
        self._check_forward_options()
        if self.threshold is not None:
            check_number("threshold", self.threshold, lo=0.0, hi=1.0,
                         reason="a softmax probability: 1 is never exceeded, None turns the rule off")
            _check(self.remasking == "low_confidence" and not self.remdm,
                   f"threshold={self.threshold!r} needs remasking='low_confidence' without remdm (it compares the "
                   f"model's confidences; got remasking={self.remasking!r}, remdm={self.remdm!r}): drop threshold "
                   f"or use low_confidence remasking")
        check_number("steps", self.steps, lo=1, hi=MAX_NFE, integer=True,
                     reason="one forward pass per step (two with cfg_scale > 0); the paper uses at most 256")
        _check(self.kv_cache == "off" or self.cfg_scale == 0,
               f"kv_cache={self.kv_cache!r} with cfg_scale={self.cfg_scale!r} is not supported (the unconditional "
               f"copy would need its own cache): use kv_cache='off' or cfg_scale=0")
        check_number("gen_length", self.gen_length, lo=1, hi=MAX_GEN_LENGTH, integer=True,
                     reason="the response must fit a model's context; the run checks it against the model's own")
        check_number("block_length", self.block_length, lo=0, integer=True, reason="0 = one block of gen_length")
        _choice("remasking", self.remasking, ("low_confidence", "random"))
        check_number("temperature", self.temperature, lo=0.0, hi=FP64_MAX / GUMBEL_MAX_ABS,
                     reason=f"0 = greedy; the Gumbel term T * log(-log U) with |log(-log U)| <= {GUMBEL_MAX_ABS:g} "
                            f"must be finite in float64")
        check_number("cfg_scale", self.cfg_scale, lo=0.0, hi=MAX_CFG_SCALE,
                     reason="0 = off; past 2^24 the unconditional logits fall below float32 resolution in "
                            "un + (s+1)(cond - un), so a larger scale changes nothing but the risk of overflow")
        _check(0 <= self.eos_suppress_ratio <= 1, f"eos_suppress_ratio={self.eos_suppress_ratio!r} must be in [0, 1]")
        _check(0 <= self.remdm_t_off < self.remdm_t_on <= 1,
               f"need 0 <= remdm_t_off < remdm_t_on <= 1, got {self.remdm_t_off!r}, {self.remdm_t_on!r}")
        _check(0 < self.remdm_alpha_loop <= 1, f"remdm_alpha_loop={self.remdm_alpha_loop!r} must be in (0, 1]")
        _choice("remdm_confidence", self.remdm_confidence, ("committed", "argmax"))
        bl = self.effective_block_length
        _check(self.gen_length % bl == 0, f"gen_length={self.gen_length} is not divisible by block_length={bl}")
        n_blocks = self.gen_length // bl
        _check(self.steps % n_blocks == 0,
               f"steps={self.steps} must be divisible by the number of blocks {n_blocks} (gen_length/block_length)")

    @property
    def sampler_name(self) -> str:
        """The method this config runs: 'remdm' when remdm is on, else 'remask'."""
        return REMDM if self.remdm else REMASK

    @property
    def effective_block_length(self) -> int:
        if self.block_length <= 0:
            return self.gen_length
        return min(self.block_length, self.gen_length)


@dataclass(frozen=True)
class SNRConfig(ConfigBase):
    """Training SNR distribution (paper: 0.9 per-sequence LogNormal + 0.1 smoothed ROAR, decided per sequence)."""

    distribution: Literal["mixture", "lognormal", "roar"] = "mixture"
    """'mixture' (paper), 'lognormal' only, or 'roar' only (the ROAR-only ablation)."""
    lognormal_mu: float = 1.69
    """Mean of log gamma."""
    lognormal_sigma: float = 0.9
    """Std of log gamma."""
    lognormal_clip: float = 40.0
    """Upper clamp of the LogNormal draw (no lower clamp)."""
    lognormal_per_token: bool = False
    """False: one gamma per sequence (paper). True: iid per token (released `pertoken_b1` checkpoint)."""
    roar_prob: float = 0.1
    """Probability that a whole sequence uses smoothed ROAR instead of LogNormal (mixture only)."""
    roar_clear_low: float = 80.0
    roar_clear_high: float = 100.0
    """Clear positions: gamma ~ U[roar_clear_low, roar_clear_high]."""
    roar_unknown_high: float = 1.0
    """Unknown positions: gamma ~ U[0, roar_unknown_high)."""

    def __post_init__(self) -> None:
        _choice("distribution", self.distribution, ("mixture", "lognormal", "roar"))
        _check(self.lognormal_sigma > 0, f"lognormal_sigma={self.lognormal_sigma!r} must be > 0")
        _check(self.lognormal_clip > 0, f"lognormal_clip={self.lognormal_clip!r} must be > 0")
        _check(0 <= self.roar_prob <= 1, f"roar_prob={self.roar_prob!r} must be in [0, 1]")
        _check(0 <= self.roar_clear_low <= self.roar_clear_high,
               f"need 0 <= roar_clear_low <= roar_clear_high, got {self.roar_clear_low!r}, {self.roar_clear_high!r}")
        _check(self.roar_unknown_high > 0, f"roar_unknown_high={self.roar_unknown_high!r} must be > 0")
