"""`dsl-llada demo --quick` end to end: report structure, metric ranges, caching and the CLI wrapper."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from dsl_llada.cli.main import main
from dsl_llada.toy.demo import DemoConfig
from dsl_llada.toy.demo_command import DemoSettings, run_demo
from dsl_llada.toy.evaluate import aggregate
from dsl_llada.toy.verdicts import pair_verdicts, verdicts

EXPECTED_METHODS = {"DSL-SDE", "DSL-SDE (Alg. 2 as printed)", "DSL-SDE (eta=0)", "LLaDA", "LLaDA+EOS", "LLaDA+EOS+Block",
                    "ReMDM", "DSL-Remask", "Oracle DSL-SDE", "Oracle DSL-SDE (eta=1, beta_inf=beta)", "Oracle LLaDA"}


@pytest.fixture(scope="module")
def quick_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "report"
    assert main(["demo", "--quick", "--out", str(out), "-q"]) == 0
    return out


def test_report_files(quick_report):
    for name in ("report.md", "nfe_curve.png", "results.jsonl", "config.json", "excess_loss.png", "bayes_floor.json"):
        assert (quick_report / name).is_file(), name
    for png in ("nfe_curve.png", "excess_loss.png"):
        assert (quick_report / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(quick_report.glob(".*.tmp")), "temporary files left behind"


def test_config_round_trips(quick_report):
    cfg = json.loads((quick_report / "config.json").read_text())
    demo = DemoConfig.from_dict(cfg["demo"])
    assert demo == DemoConfig.preset(quick=True)
    assert cfg["world"]["gen_length"] == demo.world["gen_length"]
    assert cfg["timings_s"]["total_s"] > 0


def test_results_cover_every_method_nfe_and_prompt(quick_report):
    cfg = DemoConfig.preset(quick=True)
    rows = [json.loads(line) for line in (quick_report / "results.jsonl").read_text().splitlines()]
    n_prompts = cfg.n_eval_open + cfg.n_eval_summarize
    assert len(rows) == len(EXPECTED_METHODS) * len(cfg.nfes) * n_prompts
    assert {r["method"] for r in rows} == EXPECTED_METHODS
    assert {r["nfe"] for r in rows} == set(cfg.nfes)
    for r in rows:
        assert math.isfinite(r["nll_sum"]) and r["nll_sum"] >= 0
        assert r["n_tokens"] == r["len"] + 1  # words + the end event
        assert 0.0 <= r["rep"] <= 1.0
        assert r["in_support"] in (0.0, 1.0)
        assert set(r["tags"]) >= {"empty", "premature_eos", "repetition", "degen_ending"}
        if r["task"] == "summarize":
            assert all(0.0 <= r["rouge"][k] <= 100.0 for k in ("rouge1", "rouge2", "rougeL"))
        # the SDE's forward passes are 2S + 1; remasking runs exactly NFE forwards
        expected = r["nfe"] + 1 if "DSL-SDE" in r["method"] else r["nfe"]
        assert r["forward_passes"] == expected


def test_report_tables(quick_report):
    text = (quick_report / "report.md").read_text()
    for heading in ("exact perplexity", "Rep %", "Summarisation", "error correction", "own samples"):
        assert heading in text
    for m in EXPECTED_METHODS:
        assert f"| {m} |" in text
    assert "dsl (converter path)" in text
    assert "nan" not in text.lower()


def test_report_gives_intervals_verdicts_and_the_environment(quick_report):
    text = (quick_report / "report.md").read_text()
    assert "## Verdicts: the paper's claims at this scale" in text
    records = [json.loads(line) for line in (quick_report / "results.jsonl").read_text().splitlines()]
    records = [r for r in records if r["method"] in EXPECTED_METHODS]  # (without the --controls test's rows)
    vs = verdicts(aggregate(records), records)
    n_nfe = len(DemoConfig.preset(quick=True).nfes)
    # the headline's 2 claims against 4 baselines (trained), against Oracle LLaDA (oracle); 4 claims x 2 pairs
    assert len(vs) == (2 * 4 + 2 + 4 * 2) * n_nfe
    assert {v["worse"] for v in vs if v["metric"] == "complete"} == {"LLaDA", "LLaDA+EOS", "LLaDA+EOS+Block", "ReMDM",
                                                                     "Oracle LLaDA"}
    assert sum(v["better"] == "Oracle DSL-SDE" and v["worse"] == "Oracle LLaDA" for v in vs) == 6 * n_nfe
    section = text.split("## Verdicts: the paper's claims at this scale")[1].split("\n## ")[0].splitlines()
    pair_lines = [ln for ln in section if ln.startswith("  - ")]
    nfe_lines = [ln for ln in section if ln.startswith("    - NFE ")]
    # one line per method pair, with its verdict; one per tested NFE, one per pair for its undecidable NFEs
    pvs = pair_verdicts(vs)
    assert len(pair_lines) == len(pvs)
    assert all(any(f"**{word}**" in ln for word in ("reproduced", "contradicted", "inconclusive", "depends on NFE",
                                                    "undecidable at this scale")) for ln in pair_lines)
    tested = [v for v in vs if v["verdict"] != "undecidable at this scale"]
    assert sum(", Holm p = " in ln for ln in nfe_lines) == len(tested)
    partly = sum(pv["verdict"] != "undecidable at this scale" and bool(pv["undecidable at this scale"]) for pv in pvs)
    assert len(nfe_lines) == len(tested) + partly
    for heading in ("complete answers %", "exact perplexity of the complete answers only"):
        assert heading in text
    assert "| DSL-SDE | " in text and " [" in text.split("exact perplexity (lower is better)")[1].split("##")[0]
    env = json.loads((quick_report / "config.json").read_text())["environment"]
    assert env["cpu_capability"] and env["threads"]["intra_op"] >= 1 and env["libraries"]["torch"]
    assert "load_average_end" in env and env["seeds"] == {"demo": 0}
    assert text.rstrip().splitlines()[-1].startswith("Environment: dsl-llada ")


def test_seeds_option_is_bounded(tmp_path, capsys):
    assert main(["demo", "--quick", "--seeds", "17", "--out", str(tmp_path / "d")]) == 2
    assert "--seeds must be an integer from 1 to 16, got 17" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()  # refused before anything was written


def test_second_run_reuses_cached_models_as_a_library_call(quick_report, capsys):
    before = (quick_report / "results.jsonl").read_bytes()
    assert run_demo(DemoSettings(out=str(quick_report), quick=True, progress=False)) == 0
    out = capsys.readouterr().out
    assert "pretrained masked DLM: the one shipped with the package" in out
    assert "DSL continue-pretraining: cached" in out
    if "MDM-CPT" not in before.decode():  # (the --controls test, when it ran first, added the controls' rows)
        assert (quick_report / "results.jsonl").read_bytes() == before  # the cached checkpoint samples the same


def test_demo_settings_refuse_bad_values(tmp_path):
    with pytest.raises(ValueError, match=r"--dtype 'fp16' is not valid; expected one of \['auto', 'float32'"):
        DemoSettings(out=str(tmp_path / "d"), dtype="fp16")
    with pytest.raises(ValueError, match="--sweep and --cache-frontier are two runs; pass one"):
        DemoSettings(out=str(tmp_path / "d"), sweep=True, cache_frontier=True)
    with pytest.raises(ValueError, match="--seed -1 is out of range"):
        run_demo(DemoSettings(out=str(tmp_path / "d"), quick=True, seed=-1))
    assert not (tmp_path / "d").exists()


def test_demo_help(capsys):
    with pytest.raises(SystemExit) as e:
        main(["demo", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--quick", "--controls", "--seeds", "--from-scratch", "--sweep", "--cache-frontier", "--out"):
        assert flag in out


def test_controls_flag_adds_mdm_cpt_and_xdlm(quick_report, capsys):
    assert main(["demo", "--quick", "--controls", "--out", str(quick_report), "-q"]) == 0
    out = capsys.readouterr().out
    assert "DSL continue-pretraining: cached" in out and "MDM-CPT control (" in out and "XDLM control (" in out
    rows = [json.loads(line) for line in (quick_report / "results.jsonl").read_text().splitlines()]
    assert {r["method"] for r in rows} == EXPECTED_METHODS | {"MDM-CPT", "XDLM"}
    text = (quick_report / "report.md").read_text()
    assert "| mdm | 10% |" in text and "| xdlm | 50% |" in text


def test_report_measures_every_checkpoint_against_the_bayes_floor(quick_report):
    data = json.loads((quick_report / "bayes_floor.json").read_text())
    rows = data["rows"]
    # every checkpoint of the last run (the module's --controls run, when it ran first, adds the two controls)
    assert {"pretrained MDM", "DSL"} <= {r["model"] for r in rows} <= {"pretrained MDM", "DSL", "MDM-CPT", "XDLM"}
    assert {r["kind"] for r in rows if r["model"] == "DSL"} == {"dsl", "dsl-train"}
    assert {r["kind"] for r in rows if r["model"] != "DSL"} == {"mdm"}  # discrete models: the masked observation
    for r in rows:
        assert r["oracle_ce"] >= 0 and r["n"] > 0
        assert r["model_ce"] > r["oracle_ce"] - 0.02  # no model beats the Bayes floor beyond sampling noise
    dsl = [r for r in rows if r["kind"] == "dsl"]
    assert [r["oracle_ce"] for r in dsl] == sorted((r["oracle_ce"] for r in dsl), reverse=True)  # more SNR, lower floor
    text = (quick_report / "report.md").read_text()
    assert "## Where off-grammar text comes from" in text and "![excess loss](excess_loss.png)" in text


def test_the_oracle_sde_stays_in_the_grammar(quick_report):
    """With the exact denoiser the paper-default SDE writes in-support text: what the trained rows lose is model error."""
    rows = [json.loads(line) for line in (quick_report / "results.jsonl").read_text().splitlines()]
    oracle = [r for r in rows if r["method"] == "Oracle DSL-SDE" and r["task"] == "open"]
    assert oracle and sum(r["in_support"] for r in oracle) / len(oracle) >= 0.9


# -- the docs' paths to the demo's outputs exist -----------------------------------------------------------------------
ROOT = Path(__file__).resolve().parents[1]
DOC_FILES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "configs" / "eval").glob("toy*.yaml")])
DEMO_PATH = re.compile(r"(?<![\w/.-])(dsl-llada-demo|OUT)/([A-Za-z0-9_.<>*/-]*[A-Za-z0-9_>*/])")
"""A path into the demo's output folder: under its default name or the docs' OUT (docs/benchmarks.md's OUT is a
benchmark's folder and is not read)."""
FLAG_ONLY = {"sweep/": "--sweep", "cache_frontier/": "--cache-frontier", "cache/pretrained-mdm-": "--from-scratch",
             "cache/cpt-mdm-": "--controls", "cache/cpt-xdlm-": "--controls"}
"""Paths that only a run with a flag writes: the docs must name the flag beside them (same line or the 8 before)."""
README_ROW = re.compile(r"^\| `dsl-llada demo \[--quick\][^|]*\|(.*)\|\s*$", re.M)


def doc_paths() -> list[tuple[str, int, str, str]]:
    """(file, line, path inside OUT, the text around it) for every demo-output path the docs give."""
    found = []
    for f in DOC_FILES:
        if f.name == "benchmarks.md":
            continue
        lines = f.read_text().splitlines()
        for i, line in enumerate(lines):
            for m in DEMO_PATH.finditer(line):
                found.append((f.name, i + 1, m.group(2), "\n".join(lines[max(0, i - 8): i + 1])))
    return found


def test_the_docs_give_paths_into_the_demos_folder():
    paths = {p for _, _, p, _ in doc_paths()}
    assert {"cache", "cache/cpt-dsl-<hash>", "config.json"} <= paths  # the parser finds what the docs say today


def test_every_path_the_docs_give_for_the_demos_outputs_exists(quick_report):
    missing = []
    for name, line, rel, around in doc_paths():
        if "XXXXXXXX" in rel:  # a temp name pattern: what only an interrupted run leaves
            continue
        flag = next((flag for prefix, flag in FLAG_ONLY.items() if rel.startswith(prefix)), None)
        if flag is not None:
            if flag not in around:
                missing.append(f"{name}:{line}: {rel} is written only with {flag}, which the docs do not say there")
            continue
        pattern = re.sub(r"<hash>|\b[0-9a-f]{12}\b", "*", rel.rstrip("/"))
        if not list(quick_report.glob(pattern)):
            missing.append(f"{name}:{line}: {rel} is not in the demo's output folder")
    readme = README_ROW.search((ROOT / "README.md").read_text())
    assert readme is not None, "the README's table row of `dsl-llada demo` was not found"
    files = re.findall(r"`([\w.-]+\.(?:md|png|json|jsonl))`", readme.group(1).split("writes", 1)[1])
    assert {"report.md", "results.jsonl", "config.json"} <= set(files)
    missing += [f"README.md: {f} is not in the demo's output folder" for f in files if not (quick_report / f).is_file()]
    assert not missing, "\n".join(missing)


def test_the_demos_files_name_one_run(quick_report):
    cfg = json.loads((quick_report / "config.json").read_text())
    assert cfg["files"] == sorted(["bayes_floor.json", "config.json", "excess_loss.png", "nfe_curve.png", "report.md",
                                   "results.jsonl"])
    assert json.loads((quick_report / "bayes_floor.json").read_text())["run_id"] == cfg["run_id"]
    assert f"Run `{cfg['run_id']}`" in (quick_report / "report.md").read_text()
    assert not [p.name for p in quick_report.iterdir() if p.name.startswith(".")]  # no stage or temp file left


@pytest.mark.parametrize("dsl_steps", [7, 11])
def test_controls_train_as_many_updates_as_the_dsl_stage_took(tmp_path, monkeypatch, dsl_steps):
    """The paper's controls (MDM-CPT, XDLM) are matched at equal extra steps: when the DSL stage stopped at its
    target after N updates, each control runs N updates, not the DSL stage's cap."""
    import dsl_llada.toy.demo as demo_module
    from dsl_llada.toy.demo import Demo

    seen: dict[str, int] = {}

    def fake_stage(model, tokenizer, examples, stage, **kw):
        seen[stage.objective] = stage.steps
        return [1.0] * stage.steps

    monkeypatch.setattr(demo_module, "run_stage", fake_stage)
    demo = Demo(DemoConfig(), tmp_path, progress=False, echo=lambda *a: None)
    demo.stops["dsl"] = {"target": 0.12, "steps": dsl_steps, "checks": []}
    base = demo._fresh_backbone()
    train = demo.corpora(1, 1)[0][:4]
    for objective in ("mdm", "xdlm"):
        demo.adapted(base, train, objective)
    assert seen == {"mdm": dsl_steps, "xdlm": dsl_steps}
    assert DemoConfig().cpt.steps not in seen.values()


def test_report_holds_the_tv_distance_of_both_samplers_and_both_denoisers(quick_report):
    floor = json.loads((quick_report / "bayes_floor.json").read_text())
    rows = floor["tv"]
    assert {(r["method"], r["denoiser"]) for r in rows} == {("DSL-SDE", "trained"), ("DSL-SDE", "oracle"),
                                                            ("LLaDA", "trained"), ("LLaDA", "oracle")}
    assert len(rows) == 4 * 3 and {r["nfe"] for r in rows} == {4, 16, 64}  # the quick demo's NFEs
    for r in rows:
        assert r["documents"] == 2 and r["n"] == 8
        assert 0.0 <= r["lo"] <= r["tv"] <= r["hi"] <= 1.0 and 0.0 < r["floor"] < 1.0
    report = (quick_report / "report.md").read_text()
    assert "## Output distributions against the exact distribution (total variation" in report
    assert report.count("| DSL-SDE | oracle |") == 1 and report.count("| LLaDA | trained |") == 1


@pytest.mark.parametrize("field, value, message", [
    ("tv_documents", 25, "tv_documents=25 must be an integer from 0 to n_eval_summarize (24)"),
    ("tv_samples", 0, "tv_samples=0 must be an integer from 1 to 1024"),
])
def test_tv_table_sizes_are_bounded(field, value, message):
    from dsl_llada.config import ConfigError

    with pytest.raises(ConfigError, match=re.escape(message)):
        DemoConfig(**{field: value})


def test_run_stage_calls_on_update_after_every_update_and_before_check(tmp_path):
    from dsl_llada.toy.demo import Demo
    from dsl_llada.toy.demo_train import TrainStage, run_stage

    demo = Demo(DemoConfig(d_model=16, n_layers=1, n_heads=2, noise_dim=8, n_train=8), tmp_path, progress=False,
                echo=lambda *a: None)
    train = demo.corpora(1, 1)[0]
    events: list[tuple[str, int]] = []
    curve = run_stage(demo._fresh_backbone(), demo.tok, train, TrainStage(objective="mdm", steps=4, batch_size=2,
                                                                           warmup=1),
                      seed=0, block_size=demo._block(train), gen_length=demo.gen_length, progress=False,
                      check=lambda step, m: events.append(("check", step)) or step == 3, check_every=3,
                      on_update=lambda step, m: events.append(("update", step)))
    assert len(curve) == 3  # the check at update 3 ended the stage
    assert events == [("update", 1), ("update", 2), ("update", 3), ("check", 3)]
