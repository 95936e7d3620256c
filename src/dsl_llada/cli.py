"""`dsl-llada` command line: thin wrappers over library functions (no algorithmic code here)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from . import __version__
from .utils import run_cli_command


def _add_sampler_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampler")
    g.add_argument("--sampler", default="sde", choices=["sde", "block-sde", "remask", "remdm"],
                   help="sde = DSL-LLaDA-SDE (Heun); block-sde; remask = LLaDA low-confidence remasking; remdm = ReMDM-conf-loop")
    g.add_argument("--gen-length", type=int, default=256, help="response length in tokens (default 256)")
    g.add_argument("--nfe", type=int, default=64, help="SDE: solver model evaluations, even (default 64)")
    g.add_argument("--schedule", default="sensitive", choices=["sensitive", "paper-exact", "uniform"])
    g.add_argument("--eta", type=float, default=None, help="SDE noise scale (default: by NFE, as the paper)")
    g.add_argument("--top-m", type=int, default=512, help="SDE denoiser top-M (default 512)")
    g.add_argument("--beta-scale", type=float, default=2.0, help="SDE: beta_inf = scale x trained beta (default 2)")
    g.add_argument("--beta-absolute", type=float, default=None, help="SDE: absolute beta_inf (overrides --beta-scale)")
    g.add_argument("--predictor-noise", action=argparse.BooleanOptionalAction, default=True,
                   help="SDE: noise also in the Heun predictor (default; the authors' sampler behind the paper's "
                        "numbers); --no-predictor-noise = Algorithm 2 as printed")
    g.add_argument("--steps", type=int, default=64, help="remask/remdm: denoising steps (default 64)")
    g.add_argument("--block-length", type=int, default=0, help="block length (remask: semi-AR blocks; block-sde: B)")
    g.add_argument("--temperature", type=float, default=0.0, help="remask: Gumbel temperature (0 = greedy)")
    g.add_argument("--remasking", default="low_confidence", choices=["low_confidence", "random"])
    g.add_argument("--cfg-scale", type=float, default=0.0, help="remask: classifier-free guidance scale")
    g.add_argument("--eos-inf", action="store_true", help="remask: EOS logit -inf ('LLaDA+EOS')")
    g.add_argument("--no-truncate", action="store_true", help="keep tokens after the first EOS/EoT")


def _sampler_choice(a: argparse.Namespace):
    from .config import RemaskConfig, SDEConfig  # noqa: PLC0415
    from .generation import SamplerChoice  # noqa: PLC0415

    if a.sampler in ("sde", "block-sde"):
        if a.sampler == "block-sde" and a.block_length <= 0:
            raise ValueError("--sampler block-sde needs --block-length > 0")
        cfg = SDEConfig(nfe=a.nfe, gen_length=a.gen_length, schedule=a.schedule, eta=a.eta, top_m=a.top_m,
                        beta_scale=a.beta_scale, beta_absolute=a.beta_absolute, predictor_noise=a.predictor_noise,
                        truncate_at_eos=not a.no_truncate, block_length=a.block_length if a.sampler == "block-sde" else 0)
    else:
        cfg = RemaskConfig(steps=a.steps, gen_length=a.gen_length, block_length=a.block_length, remasking=a.remasking,
                           temperature=a.temperature, cfg_scale=a.cfg_scale, eos_inf=a.eos_inf,
                           remdm=a.sampler == "remdm", truncate_at_eos=not a.no_truncate)
    return SamplerChoice(a.sampler, cfg)


def cmd_generate(a: argparse.Namespace) -> int:
    from .generation import default_device, generate, load_model, load_tokenizer, parse_dtype, read_prompts, write_jsonl  # noqa: PLC0415

    choice = _sampler_choice(a)
    prompts = list(a.prompt or [])
    if a.prompts_file:
        prompts += read_prompts(a.prompts_file, a.prompt_field)
    if not prompts:
        raise ValueError("no prompts: pass --prompt TEXT (repeatable) or --prompts-file FILE.jsonl")
    from .backbones import resolve_model_path  # noqa: PLC0415

    device = a.device or default_device()
    a.model = str(resolve_model_path(a.model, allow_download=a.allow_download))
    model = load_model(a.model, dtype=parse_dtype(a.dtype or ("bfloat16" if device.startswith("cuda") else "float32")),
                       device=device)
    tok = load_tokenizer(a.tokenizer or a.model)
    records = generate(model, tok, prompts, choice, batch_size=a.batch_size, seed=a.seed,
                       chat_template=not a.no_chat_template, progress=not a.quiet)
    if a.output:
        write_jsonl(a.output, records)
        Path(str(a.output) + ".config.json").write_text(json.dumps(
            {"model": str(a.model), "sampler": choice.name, "config": choice.config.to_dict(), "seed": a.seed}, indent=2))
    for r in records:
        print(json.dumps({"index": r["index"], "response": r["response"]}, ensure_ascii=False))
    return 0


def cmd_convert(a: argparse.Namespace) -> int:
    from .backbones import load_backbone  # noqa: PLC0415
    from .config import ConverterConfig, DSLConfig  # noqa: PLC0415
    from .generation import parse_dtype  # noqa: PLC0415
    from .model import DSLModel  # noqa: PLC0415

    cfg = DSLConfig(converter=ConverterConfig(noise_dim=a.noise_dim, noise_init=a.noise_init, beta_init=a.beta_init,
                                              layout=a.layout, trainable_noise_embed=not a.frozen_noise_embed,
                                              noise_seed=a.seed),
                    context_embedding=a.context_embedding)
    from .backbones import resolve_model_path  # noqa: PLC0415

    a.backbone = str(resolve_model_path(a.backbone, allow_download=a.allow_download))
    backbone = load_backbone(a.backbone, dtype=parse_dtype(a.dtype))
    model = DSLModel.convert(backbone, cfg)
    extra = {}
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        src = Path(a.backbone) / name
        if src.exists():
            extra[name] = src.read_text()
    model.save_pretrained(a.output, extra_files=extra)
    print(f"wrote DSL checkpoint to {a.output} (noise_dim={a.noise_dim}, beta_init={a.beta_init}, layout={a.layout})")
    return 0


def cmd_demo(a: argparse.Namespace) -> int:
    from .toy.demo import run_demo_cli  # noqa: PLC0415

    return run_demo_cli(a)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dsl-llada", description="DSL-LLaDA: continuous-noise adaptation of masked diffusion LMs")
    p.add_argument("--version", action="version", version=f"dsl-llada {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="sample responses from a DSL checkpoint or a backbone")
    g.add_argument("--model", required=True, help="checkpoint folder (DSL or backbone), or a hub id with --allow-download")
    g.add_argument("--allow-download", action="store_true", help="allow fetching --model from the Hugging Face hub")
    g.add_argument("--tokenizer", default=None, help="tokenizer folder (default: the model folder)")
    g.add_argument("--prompt", action="append", help="a prompt (repeatable)")
    g.add_argument("--prompts-file", default=None, help="JSONL file with one prompt per line (or .txt)")
    g.add_argument("--prompt-field", default="prompt", help="JSONL field holding the prompt (default 'prompt')")
    g.add_argument("--no-chat-template", action="store_true", help="encode prompts raw (prefix continuation)")
    g.add_argument("--batch-size", type=int, default=8)
    g.add_argument("--seed", type=int, default=42, help="prompt i uses seed + i")
    g.add_argument("--output", default=None, help="write records to this JSONL file (atomically)")
    g.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    g.add_argument("--dtype", default=None, help="float32 / bfloat16 (default: bf16 on GPU, fp32 on CPU)")
    g.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    _add_sampler_args(g)
    g.set_defaults(func=cmd_generate)

    c = sub.add_parser("convert", help="make a fresh DSL checkpoint from a backbone folder")
    c.add_argument("backbone", help="backbone checkpoint folder (e.g. LLaDA-8B-Instruct)")
    c.add_argument("output", help="output folder")
    c.add_argument("--allow-download", action="store_true", help="allow fetching the backbone from the Hugging Face hub")
    c.add_argument("--noise-dim", type=int, default=100)
    c.add_argument("--noise-init", default="random", choices=["random", "pca"])
    c.add_argument("--beta-init", type=float, default=1.0)
    c.add_argument("--layout", default="released", choices=["released", "paper"])
    c.add_argument("--context-embedding", default="converter", choices=["converter", "wte"])
    c.add_argument("--frozen-noise-embed", action="store_true", help="authors' frozen noise embedding")
    c.add_argument("--seed", type=int, default=42, help="noise-embedding init seed")
    c.add_argument("--dtype", default="float32")
    c.set_defaults(func=cmd_convert)

    d = sub.add_parser("demo", help="the whole pipeline on the embedded toy world (CPU, minutes)")
    d.add_argument("--quick", action="store_true", help="a ~2-minute version")
    d.add_argument("--out", default="dsl-llada-demo", help="report folder (default ./dsl-llada-demo)")
    d.add_argument("--controls", action="store_true", help="also train the MDM-CPT and XDLM controls")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--sweep", action="store_true", help="run the paper's SDE sensitivity sweep on the demo's checkpoints "
                   "(trained or cached) instead of the demo's comparison; writes OUT/sweep/")
    d.add_argument("--sweep-prompts", type=int, default=None, metavar="N",
                   help="sweep: N open-ended + N/2 summarisation prompts (default 96; 8 with --quick)")
    d.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    d.set_defaults(func=cmd_demo)

    try:
        from .train.cli import add_train_parser  # noqa: PLC0415
    except ImportError:
        pass
    else:
        add_train_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    return run_cli_command(args.func, args,
                           interrupted="interrupted; finished artifacts are kept, partial ones were not written")


if __name__ == "__main__":
    sys.exit(main())
