"""`python scripts/docs_tables.py`: docs tables name their command and environment; cheap ones are re-made and
checked against the intervals the docs state; the benchmark pages' tables are rendered from benchmarks/results/."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import docs_tables as D  # a checkout tool (scripts/), not part of the installed package
import page_tables as P  # the benchmark pages' tables, beside it

DOC_OK = """# T

### Measured

Command: `python benchmarks/x.py`

| a | b | c |
|---|---|---|
| r1 | 1.0 | 2 % |
| r2 | 3.5 | 4 % |

Environment: dsl-llada 0.1.0 (git abc), ...
"""


def test_lint_flags_a_number_table_without_command_or_environment(tmp_path):
    (tmp_path / "ok.md").write_text(DOC_OK)
    (tmp_path / "options.md").write_text("## Options\n\n| flag | meaning |\n|---|---|\n| --x | a thing |\n| --y | b |\n")
    assert D.lint(tmp_path) == []  # an options table is not a measurement
    (tmp_path / "bad.md").write_text(DOC_OK.replace("Command: `python benchmarks/x.py`", "")
                                     .replace("Environment: dsl-llada 0.1.0 (git abc), ...", ""))
    problems = D.lint(tmp_path)
    assert len(problems) == 1 and "bad.md:3: table without command and environment" in problems[0]


def test_every_docs_table_is_traced():
    assert D.lint() == []


def test_stated_values_parse_value_and_interval():
    text = "| label | PPL | Len |\n|---|---|---|\n| world, open | 5.27 [4.83, 5.70] | 10 |\n"
    assert D.stated_values(text) == {("world, open", "PPL"): (5.27, 4.83, 5.70)}


def _table(tmp_path, monkeypatch, value: float) -> D.Table:
    monkeypatch.setattr(D, "DOCS", tmp_path)
    (tmp_path / "r.md").write_text("<!-- docs-table: t -->\n| label | PPL |\n|---|---|\n| x | 5.27 [4.83, 5.70] |\n"
                                   "<!-- /docs-table -->\n")
    return D.Table("t", "r.md", "T", lambda: ("", {("x", "PPL"): value}))


def test_check_passes_inside_the_interval_and_fails_outside(tmp_path, monkeypatch):
    assert D.check_table(_table(tmp_path, monkeypatch, 5.704)) == []  # inside, up to the docs' rounding
    problems = D.check_table(_table(tmp_path, monkeypatch, 5.9))
    assert problems == ["t: x / PPL = 5.9 is outside the stated interval [4.83, 5.7]"]
    monkeypatch.setattr(D, "DOCS", tmp_path)
    assert "no block" in D.check_table(D.Table("u", "r.md", "U", lambda: ("", {})))[0]


def test_the_cheap_reference_table_comes_back_within_its_interval():
    assert D.check_table(D.TABLES["toy-reference"]) == []


@pytest.mark.slow
def test_the_untrained_model_table_comes_back_within_its_interval():
    assert D.check_table(D.TABLES["toy-untrained"]) == []


def test_cli_rejects_unknown_tables(capsys):
    assert D.main(["--write", "nope"]) == 2
    assert "unknown table(s) ['nope']" in capsys.readouterr().err


def test_cli_lints_a_given_docs_folder_and_refuses_a_missing_one(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(D, "DOCS", D.DOCS)  # restored after the test (main rebinds it)
    (tmp_path / "ok.md").write_text(DOC_OK)
    assert D.main(["--lint", "--docs", str(tmp_path)]) == 0
    assert D.main(["--lint", "--docs", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err


# ---- the benchmark pages' tables, rendered from benchmarks/results/


def _docs_copy(tmp_path):
    docs = tmp_path / "docs"
    shutil.copytree(D.DOCS / "benchmarks", docs / "benchmarks")
    return docs


def test_every_page_table_matches_its_results():
    assert P.check_pages(D.DOCS, D.RESULTS) == []
    assert len(P.TABLES) == 57 and {t.page for t in P.TABLES.values()} == {
        "cpu-sampling.md", "gpu.md", "precision-memory.md", "process-settings.md", "serving.md", "toy-frontier.md"}


def test_a_hand_edited_page_fails_the_check_and_passes_after_write_pages(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(D, "DOCS", D.DOCS)  # restored after the test (main rebinds it)
    docs = _docs_copy(tmp_path)
    page = docs / "benchmarks" / "gpu.md"
    original = page.read_text()
    row = "| 8 | 80.4 | 31009.9 | 49.0 % | 0.170 | 5.90 | 755 |"
    assert original.count(row) == 1
    page.write_text(original.replace(row, row.replace("| 0.170 |", "| 0.150 |")))
    assert D.main(["--check-pages", "--docs", str(docs)]) == 1
    out = capsys.readouterr().out
    assert ("docs/benchmarks/gpu.md: table 'gpu-batched' differs from benchmarks/results/gpu_h200_8b.json: line 4 "
            "(row '8'), 'SDE s/sample': page '0.150', results '0.170' (run --write-pages)") in out
    assert "FAIL: 1 problem(s)" in out
    assert D.main(["--write-pages", "--docs", str(docs)]) == 0
    assert "wrote 1 of 57 page table(s) that differed: gpu-batched" in capsys.readouterr().out
    assert page.read_text() == original
    assert D.main(["--check-pages", "--docs", str(docs)]) == 0
    assert D.main(["--write-pages", "--docs", str(docs)]) == 0
    assert "wrote 0 of 57" in capsys.readouterr().out


def test_a_changed_result_shows_on_its_page(tmp_path):
    docs, results = _docs_copy(tmp_path), tmp_path / "results"
    shutil.copytree(D.RESULTS, results)
    path = results / "threshold_h200.json"
    r = json.loads(path.read_text())
    r["results"]["1"]["threshold"]["samples_per_s"] = 3.0
    path.write_text(json.dumps(r))
    assert P.check_pages(docs, results) == [
        "docs/benchmarks/gpu.md: table 'gpu-threshold' differs from benchmarks/results/threshold_h200.json: line 3 "
        "(row '1'), 'samples/s': page '2.29', results '3.00' (run --write-pages)"]
    assert P.write_pages(docs, results, ["gpu-threshold"]) == ["gpu-threshold"]
    assert "| 1 | 20 | 6.4 | 3.00 | 1.48 | **1.59×** (1.55–1.65) |" in (docs / "benchmarks" / "gpu.md").read_text()
    assert P.check_pages(docs, results) == []


def test_write_pages_refuses_unknown_names_and_pages_without_the_block(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(D, "DOCS", D.DOCS)
    docs = _docs_copy(tmp_path)
    assert D.main(["--write-pages", "nope", "--docs", str(docs)]) == 2
    assert "unknown page table(s) ['nope']" in capsys.readouterr().err
    assert D.main(["--check-pages", "--docs", str(docs), "--results", str(tmp_path / "none")]) == 2
    assert f"error: results folder {str(tmp_path / 'none')!r} does not exist; pass --results DIR" in capsys.readouterr().err
    page = docs / "benchmarks" / "serving.md"
    page.write_text(page.read_text().replace("<!-- docs-table: serve-h200-d64 -->\n", ""))
    assert D.main(["--write-pages", "--docs", str(docs)]) == 2
    assert "docs/benchmarks/serving.md has no block for table 'serve-h200-d64'" in capsys.readouterr().err
    assert D.main(["--check-pages", "--docs", str(docs)]) == 1
    assert "docs/benchmarks/serving.md: no block for table 'serve-h200-d64'" in capsys.readouterr().out


def test_lint_names_tables_neither_generated_nor_listed(tmp_path, monkeypatch):
    (tmp_path / "benchmarks").mkdir()
    section = "### Run {n}\n\nCommand: `python benchmarks/x.py`\n\n| a | b | c |\n|---|---|---|\n| r1 | 1.0 | 2 % |\n" \
              "| r2 | 3.5 | 4 % |\n\nEnvironment: dsl-llada 0.1.0\n\n"
    (tmp_path / "benchmarks" / "p.md").write_text("# P\n\n" + section.format(n=1) + section.format(n=2)
                                                  + "### Run 3\n\n<!-- docs-table: t -->\n| a | b |\n|---|---|\n"
                                                    "| r | 1.0 |\n| s | 2.0 |\n| u | 3.0 |\n| v | 4.0 |\n"
                                                    "<!-- /docs-table -->\n")
    monkeypatch.setattr(P, "NOT_GENERATED", (P.NotGenerated("p.md", "Run 1", "no results file"),
                                             P.NotGenerated("p.md", "Run 9", "gone")))
    problems, notes = P.lint_pages(tmp_path, D._has_measurement_table)
    assert problems == [
        "docs/benchmarks/p.md:18: measurement table not generated from benchmarks/results/ and not listed as not "
        "generated (section 'Run 2')",
        "docs/benchmarks/p.md: section 'Run 9' is listed as not generated but holds no measurement table outside "
        "a block"]
    assert notes == ["not generated: docs/benchmarks/p.md, 'Run 1': no results file",
                     "not generated: docs/benchmarks/p.md, 'Run 9': gone"]


def test_every_benchmark_page_table_is_generated_or_listed_with_a_reason():
    problems, notes = P.lint_pages(D.DOCS, D._has_measurement_table)
    assert problems == [] and len(notes) == len(P.NOT_GENERATED) == 0
    assert all(n.reason for n in P.NOT_GENERATED)


_ENV = {"dsl_llada": "0.1.0", "git": {"commit": "0123456789abcdef", "dirty": True}, "python": "3.11.7",
        "libraries": {"torch": "2.13.0+cpu"}, "device": "cpu", "cpu_model": "AMD EPYC", "cpu_capability": "AVX512",
        "threads": {"intra_op": 1}, "usable_cpus": 2, "load_average_start": 0.5, "load_average_end": 1.25}


def test_environment_line_names_commit_threads_and_load():
    assert P.environment_line(_ENV) == (
        "Environment: dsl-llada 0.1.0 (git 012345678 (dirty)), Python 3.11.7, torch 2.13.0+cpu; cpu on AMD EPYC "
        "(AVX512), 1 intra-op thread(s) of 2 usable CPUs; 1-minute load 0.5 -> 1.25.")
    assert P.environment_line(None) == "Environment: not recorded."


def test_serve_rounds_summary_renders_table_ratios_and_environment():
    r = {"environment": _ENV, "result": {
        "rounds": 2, "clients": 16, "mean_batch": 13.5, "single_client_equal_to_library": "2/2",
        "seconds": {"generate": [0.1, 0.3], "server, 1 client": [0.2, 0.4], "batched, N clients": [2.0, 3.0],
                    "--max-batch 1, N clients": [4.0, 5.0]},
        "latency_ratio": {"median": 1.5, "min": 1.333, "max": 2.0},
        "throughput_ratio": {"median": 1.833, "min": 1.667, "max": 2.0},
        "sampler_ceiling": {"median": 1.6, "min": 1.5, "max": 1.7}}}
    table, summary, env = P.serve_rounds_summary(r).split("\n\n")
    assert table.splitlines()[2:] == ["| generate | 0.2000 | 0.1000 | 0.3000 |",
                                      "| server, 1 client | 0.3000 | 0.2000 | 0.4000 |",
                                      "| batched, N clients | 2.5000 | 2.0000 | 3.0000 |",
                                      "| --max-batch 1, N clients | 4.5000 | 4.0000 | 5.0000 |"]
    assert summary == (
        "Over 2 round(s): single-client latency / `generate` **1.500x** (1.333–2.000); throughput batched / "
        "`--max-batch 1` at 16 clients **1.83x** (1.67–2.00; mean batch 13.5); the sampler's own batch-16 speed-up, "
        "N x t(batch 1) / t(batch N), **1.60x** (1.50–1.70). Single-client outputs equal to the library: 2/2.")
    assert env == P.environment_line(_ENV)


def _busy(nfe: int, variants: list[str], ratio: float) -> dict:
    entry = {"ratio": ratio, "ratio_rounds": [ratio - 0.5, ratio, ratio + 1.0], "idle_median_s": 0.25,
             "loaded_median_s": 0.25 * ratio}
    return {"nfe": nfe, "rounds": 3, "variants": variants,
            "table": {v: {s: dict(entry) for s in ("sde", "authors_sde", "remask", "authors_remask")} for v in variants}}


def test_busy_summary_rows_per_run_and_variant_with_phase_rows_for_both_settings():
    text = P.busy_summary(_busy(16, ["passive"], 3.0), _busy(4, ["openmp-default", "configure-process"], 2.0))
    lines = text.splitlines()
    assert len(lines) == 2 + 1 + 2 + 2
    assert lines[2] == ('| `configure_process(openmp_wait="passive")`, NFE 16, 3 rounds: loaded / idle | 3.00x (2.50–4.00) | '
                        '3.00x (2.50–4.00) | 3.00x (2.50–4.00) | 3.00x (2.50–4.00) |')
    assert lines[3].startswith("| OpenMP's own, NFE 4, 3 rounds: loaded / idle | 2.00x (1.50–3.00) |")
    assert lines[4] == ("| `configure_process()`, NFE 4, 3 rounds: loaded / idle | **2.00x** (1.50–3.00) | 2.00x (1.50–3.00) "
                        "| **2.00x** (1.50–3.00) | 2.00x (1.50–3.00) |")
    assert lines[5] == ("| NFE 4, idle phase: OpenMP's own → `configure_process()`, s | 0.250 → 0.250 | 0.250 → 0.250 | "
                        "0.250 → 0.250 | 0.250 → 0.250 |")
    assert lines[6].startswith("| NFE 4, loaded phase: OpenMP's own → `configure_process()`, s | 0.500 → 0.500 |")


def test_demo_runs_rows_per_stage_and_variant_with_kernel_paths():
    r = {"variants": ["native", "quick"], "environment": _ENV, "runs": {
        "native": {"wall_s": 230.6, "timings_s": {"dsl_s": 131.4, "sampling_s": 64.0, "total_s": 221.2},
                   "demo_environment": {"cpu_capability": "AVX512"}},
        "quick": {"wall_s": 45.2, "timings_s": {"dsl_s": 20.0, "total_s": 41.0, "extra_s": 1.0},
                  "demo_environment": {"cpu_capability": "AVX512"}}}}
    table, paths, env = P.demo_runs(r).split("\n\n")
    assert table.splitlines() == [
        "| stage, seconds | default demo | `--quick` |", "|---|---|---|",
        "| DSL adaptation of the base | 131 | 20 |", "| sampling + scoring | 64 | - |",
        "| demo total (`total_s`) | 221 | 41 |", "| extra_s | - | 1 |", "| whole command (the process) | 231 | 45 |"]
    assert paths == "Kernel path each run recorded (`cpu_capability`): default demo AVX512, `--quick` AVX512."
    assert env == P.environment_line(_ENV)


_FRONTIER_Q = {"open": {"ppl": 5.0, "ppl_ci": [4.0, 6.0], "in_support": 90.0, "in_support_ci": [80.0, 100.0],
                        "premature_eos%": 10.0, "premature_eos%_ci": [0.0, 20.0], "complete": 80.0,
                        "complete_ci": [70.0, 90.0]},
               "summarize": {"rougeL": 50.0, "rougeL_ci": [45.0, 55.0]}}


def _frontier_run(key, rnd, label, mode, sec, load, **extra):
    return {"key": key, "round": rnd, "sampler": "Block remasking", "mode": mode, "refresh": 1 if mode == "off" else 0,
            "label": label, "n": 2, "config": {"steps": 32}, "seconds_per_sample": sec, "forward_passes": 32.0,
            "load_average": load, "threads": 2, **extra}


def test_cache_frontier_renders_the_demos_report_from_runs_and_config():
    runs = [_frontier_run("a", 0, "R=1 (exact)", "off", 0.1, 1.5, ids=[[1, 2], [3, 4]], **_FRONTIER_Q),
            _frontier_run("b", 0, "dual, R=never", "dual", 0.05, 2.5, ids=[[1, 2], [3, 5]], **_FRONTIER_Q),
            _frontier_run("stale", 0, "prefix, R=2", "prefix", 0.01, 1.0, ids=[[1, 2], [3, 4]], **_FRONTIER_Q),
            _frontier_run("a", 1, "R=1 (exact)", "off", 0.2, 1.75), _frontier_run("b", 1, "dual, R=never", "dual", 0.04, 2.0)]
    settings = {"n_open": 1, "n_summarize": 1, "blocks": 4, "remask_steps": 32, "batch_size": 8, "batch1_prompts": 0,
                "rounds": 2}
    config = {"frontier": settings, "keys": ["a", "b"], "environment": _ENV,
              "reference": {"open": {"ppl": 4.95, "in_support": 100.0, "premature_eos%": 0.0},
                            "summarize": {"rougeL": 77.2}}}
    text = P.cache_frontier(runs, config)
    lines = text.splitlines()
    assert lines[0].startswith("Every sampler on the toy world: 2 held-out prompts (1 open-ended, 1 summarisation)")
    assert "Samples per second at batch 8, median over 2 interleaved round(s)" in lines[0]
    assert lines[2] == ("Timed with 2 thread(s); 1-minute load average at the timed runs 1.5–2.5 (above the thread "
                        "count means other work shared the CPUs).")
    table = lines[4:9]
    assert table[2:] == [  # in the config's key order; a key the config does not list ('stale') is left out
        "| Block remasking | R=1 (exact) | 6.7 (5.0–10.0) | – | 32.0 | 1.00 | 100.0 | 5.00 [4.00, 6.00] | 90 [80, 100] | "
        "10 [0, 20] | 80 [70, 90] | 50.0 [45.0, 55.0] | yes |",
        "| Block remasking | dual, R=never | 22.2 (20.0–25.0) | – | 32.0 | 3.33 | 75.0 | 5.00 [4.00, 6.00] | "
        "90 [80, 100] | 10 [0, 20] | 80 [70, 90] | 50.0 [45.0, 55.0] | yes |",
        "| World (true samples) | – | – | – | – | – | – | 4.95 | 100 | 0 | – | 77.2 | – |"]
    assert lines[9:12] == ["", "Recommended points:", ""]  # a blank line ends the table
    assert lines[12] == ("- Block remasking: recommended Block remasking [dual, R=never] at 22.2 samples/s, 3.33x exact "
                         "fp32 Block remasking [R=1 (exact)] (6.7 samples/s); quality intervals overlap the reference's")
    assert "| >= 75 | Block remasking [dual, R=never]: 22.2/s; complete 80 [70, 90] %, PPL 5.00, ROUGE-L 50.0 " \
           "[45.0, 55.0] | none reaches it |" in lines
    assert lines[-1] == P.environment_line(_ENV)

    from dsl_llada.toy.frontier_report import render_run

    assert text == render_run(runs, config).rstrip("\n") + "\n\n" + P.environment_line(_ENV)  # the library's report, verbatim
    other = P.cache_frontier(runs, config | {"keys": ["b", "a"]})
    assert other.index("| dual, R=never |") < other.index("| R=1 (exact) |")


def test_the_frontier_report_imports_without_torch():
    import subprocess

    code = "import sys, dsl_llada.toy.frontier_report, dsl_llada.toy.frontier_points; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(Path(P.__file__).resolve().parents[1] / "src")})
    assert out.stdout.strip() == "False"


ENV = _ENV


def test_the_kv_cache_table_renders_each_variant_with_its_range_speedup_and_agreement():
    rows = [{"sampler": "Block SDE (NFE 8 per block)", "cache": "exact", "median_s": 1.6294, "min_s": 1.4321,
             "max_s": 1.7086, "speedup": 1.0, "same_tokens": 100.0},
            {"sampler": "Block SDE (NFE 8 per block)", "cache": "dual, R=never", "median_s": 1.404, "min_s": 1.127,
             "max_s": 1.417, "speedup": 1.1605, "same_tokens": 21.875}]
    out = P.approx_kv_cache({"rounds": 3, "rows": rows, "environment": ENV}).splitlines()
    assert out[:4] == [
        "| sampler | cache | s per sample, median (min–max) | speed-up | tokens equal to exact % |",
        "|---|---|---|---|---|",
        "| Block SDE (NFE 8 per block) | exact | 1.629 (1.432–1.709) | 1.00× | 100.0 |",
        "| Block SDE (NFE 8 per block) | dual, R=never | 1.404 (1.127–1.417) | 1.16× | 21.9 |"]
    assert out[4] == "" and out[5] == "3 interleaved round(s). " + P.environment_line(ENV)
    assert len(out) == 6


def test_the_sparse_converter_table_counts_changes_per_row_and_in_all():
    rows = [{"method": "DSL-SDE", "nfe": 4, "changed_tokens": 0, "tokens": 2304, "changed_samples": 0, "samples": 72,
             "ppl_exact": 265.514, "ppl_sparse": 265.514, "s_exact": 0.404, "s_sparse": 0.536},
            {"method": "DSL-SDE (eta=0)", "nfe": 64, "changed_tokens": 3, "tokens": 2304, "changed_samples": 2,
             "samples": 72, "ppl_exact": 436.92, "ppl_sparse": 437.1, "s_exact": 5.18, "s_sparse": 5.08}]
    out = P.approx_sparse({"quick": False, "tolerance": 1e-6, "batch_size": 48, "prompts": 72, "rows": rows,
                           "environment": ENV}).splitlines()
    assert out[:4] == [
        "| method | NFE | samples changed | tokens changed | open PPL exact → sparse | s exact / sparse |",
        "|---|---|---|---|---|---|",
        "| DSL-SDE | 4 | 0/72 | 0/2304 | 265.51 → 265.51 | 0.40 / 0.54 |",
        "| DSL-SDE (eta=0) | 64 | 2/72 | 3/2304 | 436.92 → 437.10 | 5.18 / 5.08 |"]
    assert out[5].startswith("The default demo, 72 held-out prompts, batch 48, tolerance 1e-06: 3 of 4608 tokens "
                             "changed in all. Environment: ")
    quick = P.approx_sparse({"quick": True, "tolerance": 1e-4, "batch_size": 16, "prompts": 24, "rows": rows[:1]})
    assert quick.splitlines()[-1] == ("A --quick demo, 24 held-out prompts, batch 16, tolerance 0.0001: 0 of 2304 "
                                      "tokens changed in all. Environment: not recorded.")


def test_the_eval_overhead_table_gives_both_clocks_of_the_medians_and_each_round():
    per_round = [{"sampler_wall_s": 10.0, "eval_wall_s": 8.0, "sampler_cpu_s": 3.0, "eval_cpu_s": 3.2},
                 {"sampler_wall_s": 12.0, "eval_wall_s": 12.0, "sampler_cpu_s": 3.5, "eval_cpu_s": 3.5},
                 {"sampler_wall_s": 11.0, "eval_wall_s": 10.0, "sampler_cpu_s": 3.4, "eval_cpu_s": 3.6}]
    out = P.eval_overhead({"items": 64, "rounds": 3, "threads": 1, "per_round": per_round,
                           "environment": ENV}).splitlines()
    assert out[:4] == [
        "| clock | pure sampler s (median) | `run_eval` s (median) | efficiency = sampler / eval | each round |",
        "|---|---|---|---|---|",
        "| process CPU time | 3.40 | 3.50 | **0.971** | 0.938, 1.000, 0.944 |",
        "| wall | 11.00 | 10.00 | **1.100** | 1.250, 1.000, 1.100 |"]
    assert out[5] == "64 generation items, 3 alternating round(s), 1 thread(s). " + P.environment_line(ENV)


def test_the_convert_memory_table_is_the_dry_runs_table_with_the_parameter_count():
    rows = [{"dtype": "float32", "quantize": "none", "backbone_linear_gib": 27.934, "backbone_other_gib": 1.9307,
             "dsl_converter_and_noise_gib": 1.9777, "total_gib": 31.8424},
            {"dtype": "bfloat16", "quantize": "int8", "backbone_linear_gib": 6.9883, "backbone_other_gib": 0.9653,
             "dsl_converter_and_noise_gib": 1.0124, "total_gib": 8.966}]
    out = P.convert_memory({"model": "LLaDA-8B-Instruct", "d_model": 4096, "n_layers": 32, "vocab_size": 126464,
                            "noise_dim": 100, "parameters": 8546358786, "rows": rows})
    assert out.splitlines() == [
        "| weights | backbone linear GiB | embedding + norms GiB | converter + noise table GiB | total GiB |",
        "|---|---|---|---|---|",
        "| float32 | 27.93 | 1.93 | 1.98 | 31.84 |",
        "| bfloat16 + int8 backbone (--quantize int8) | 6.99 | 0.97 | 1.01 | 8.97 |",
        "",
        "LLaDA-8B-Instruct: d_model 4096, 32 layers, vocabulary 126,464, noise dim 100: 8.55 B parameters."]


def test_a_missing_results_file_is_named_by_the_check(tmp_path):
    docs, results = _docs_copy(tmp_path), tmp_path / "results"
    shutil.copytree(D.RESULTS, results)
    (results / "threshold_h200.json").unlink()
    assert ("docs/benchmarks/gpu.md: table 'gpu-threshold': no results file benchmarks/results/threshold_h200.json "
            "(run its benchmark with --json)") in P.check_pages(docs, results)
def _loop_sampler(calls: int, call_s: float, total_s: float, eff: list[float], in_run: list[float]) -> dict:
    return {"calls": calls, "t_call_s": call_s, "t_total_s": total_s, "efficiency": sorted(eff)[len(eff) // 2],
            "in_run": sorted(in_run)[len(in_run) // 2], "efficiency_rounds": eff, "in_run_rounds": in_run}


def test_loop_renderers_give_one_row_per_nfe_and_sampler_the_batches_and_the_converter_memory():
    r = {"nfes": [16, 64], "rounds": 3, "throughput_nfe": 16,
         "loop_efficiency": {
             "16": {"sde": _loop_sampler(17, 0.0543, 0.93, [0.99, 0.984, 1.009], [0.996, 0.995, 0.997]),
                    "remask": _loop_sampler(16, 0.0412, 0.68, [1.002, 1.001, 0.964], [0.979, 0.98, 0.98])},
             "64": {"sde": _loop_sampler(65, 0.055, 3.6, [1.016, 1.004, 0.993], [0.997, 0.997, 0.998]),
                    "remask": _loop_sampler(64, 0.041, 2.7, [1.02, 0.993, 1.004], [0.98, 0.98, 0.981])}},
         "throughput": {"1": {"seconds": 0.91, "samples_per_s": 1.0989}, "4": {"seconds": 3.64, "samples_per_s": 1.0989}},
         "converter_memory": {"unchunked": {"growth_kib": 3046400}, "chunk256": {"growth_kib": 423936},
                              "pi_bytes_unchunked_MiB": 988.0, "pi_bytes_chunk256_MiB": 123.5}}
    lines = P.loop_efficiency(r).splitlines()
    assert lines[0] == ("| NFE / steps | sampler | model calls | one call alone (ms) | whole sampling (ms) | "
                        "loop efficiency (min–max over 3 rounds) | in-run share in model calls (min–max) |")
    assert lines[2:] == ["| 16 | SDE | 17 | 54.3 | 930.0 | 0.990 (0.984–1.009) | 0.996 (0.995–0.997) |",
                         "| 16 | remasking | 16 | 41.2 | 680.0 | 1.001 (0.964–1.002) | 0.980 (0.979–0.980) |",
                         "| 64 | SDE | 65 | 55.0 | 3600.0 | 1.004 (0.993–1.016) | 0.997 (0.997–0.998) |",
                         "| 64 | remasking | 64 | 41.0 | 2700.0 | 1.004 (0.993–1.020) | 0.980 (0.980–0.981) |"]
    assert P.loop_throughput(r).splitlines() == ["| batch | seconds per batch (SDE, NFE 16) | samples/s |", "|---|---|---|",
                                                 "| 1 | 0.91 | 1.10 |", "| 4 | 3.64 | 1.10 |"]
    assert P.loop_converter_memory(r).splitlines() == [
        "| variant | RSS growth during the call (MiB) | one (L, V+1) fp32 buffer (MiB) |", "|---|---|---|",
        "| unchunked | 2975 | 988 |", "| 256-token chunks | 414 | 124 |", "",
        "Chunking cuts the converter's peak by **7.2×**."]


def test_loop_renderers_keep_the_single_nfe_format_of_earlier_results():
    r = {"nfe": 32, "loop_efficiency": {"sde": {"calls": 33, "t_call_s": 0.0226, "t_total_s": 0.771,
                                                "efficiency": 0.969, "in_run": 0.987}},
         "throughput": {"16": {"seconds": 3.65, "samples_per_s": 4.38}}}
    assert P.loop_efficiency(r).splitlines()[2:] == ["| sde | 33 | 22.6 | 771.0 | 0.969 | 0.987 |"]
    assert P.loop_throughput(r).splitlines()[0] == "| batch | seconds per batch (SDE) | samples/s |"


def _roofline() -> dict:
    flops = {"slot": 0.839e9, "values": 2.148e9, "blocks": 1.887e9, "head": 2.147e9, "head_all": 4.295e9,
             "posterior_bag": 0.013e9}
    times = {"slot": 0.01012, "softmax": 0.00157, "values": 0.0136, "converter": 0.02857, "posterior_topk": 0.01491,
             "posterior_topm": 0.01013, "posterior_bag": 0.00022, "posterior": 0.01056, "call": 0.06908}
    return {"peak_gflops": 204.4, "reps": 3, "flops": flops, "times_s": times, "t_blocks": 0.01969,
            "t_head": 0.02095, "t_head_all": 0.0345, "t_remask_step": 0.04076, "t_remask_forward": 0.04007,
            "needed_sde_flops": 7.034e9, "needed_rm_flops": 4.035e9, "sde_call_vs_flop_time": 2.01,
            "remask_step_vs_flop_time": 2.07, "tolerance": 1e-6, "sparse_same_tokens": True,
            "sparse_tokens_changed": 0,
            "sparse": [{"gamma": 0.01, "kept_mean": 32769.0, "kept_max": 32769, "max_abs_dh": 0.0, "max_abs_h": 0.031,
                        "t_dense_ms": 13.29, "t_sparse_ms": 23.71},
                       {"gamma": 13.7265, "kept_mean": 4968.94, "kept_max": 10417, "max_abs_dh": 4.1e-8,
                        "max_abs_h": 0.08, "t_dense_ms": 13.49, "t_sparse_ms": 18.64}]}


def test_roofline_renderers_give_each_part_against_the_measured_peak_and_the_sparse_converter():
    r = _roofline()
    lines = P.roofline_sde(r).splitlines()
    assert lines[0] == "| component | GFLOP | ms | GFLOP/s | of peak | note |" and len(lines) == 2 + 12 + 2
    assert lines[2] == "| converter: slot logits βzKᵀ+b | 0.839 | 10.12 | 82.9 | 41 % | one addmm, cached K |"
    assert lines[3] == "| converter: softmax over V+1 | – | 1.57 | – | – | elementwise |"
    assert lines[5] == "| converter, whole | 2.987 | 28.57 | 104.6 | 51 % |  |"
    assert lines[6] == "| backbone blocks (256 positions) | 1.887 | 19.69 | 95.8 | 47 % |  |"
    assert lines[13] == ("| **whole SDE call** | 7.034 | 69.08 | 101.8 | 50 % | 2.01× the FLOP time of the needed "
                         "work |")
    assert lines[15] == ("Measured fp32 matmul peak (best square `torch.mm`, n ≤ 2048, fastest of 3 per size): **204.4 GFLOP/s**; "
                         "whole SDE call **2.01×** the FLOP time of its needed work, one remasking step **2.07×**.")
    assert P.roofline_remask(r).splitlines()[2:] == [
        "| forward: blocks + head on the current block | 4.035 | 40.07 | 100.7 | 49 % |  |",
        "| **whole remasking step** (16-step run / 16) | 4.035 | 40.76 | 99.0 | 48 % | 2.07× the FLOP time of the "
        "needed work |"]
    assert P.roofline_sparse(r).splitlines() == [
        "| SNR γ | kept slots at tolerance 1e-06, mean (max) | max abs Δh (max abs h) | dense πWᵀ ms | sparse ms |",
        "|---|---|---|---|---|", "| 0.01 | 32769.0 (32769) | 0.00e+00 (0.03) | 13.29 | 23.71 |",
        "| 13.73 | 4968.9 (10417) | 4.10e-08 (0.08) | 13.49 | 18.64 |", "",
        "NFE-16 SDE run with vs without the sparse converter: identical tokens."]
    r.update(sparse_same_tokens=False, sparse_tokens_changed=3)
    assert P.roofline_sparse(r).splitlines()[-1] == "NFE-16 SDE run with vs without the sparse converter: 3 tokens differ."


def test_ablation_renderer_gives_each_variant_its_time_faults_and_speed_up():
    r = {"identical_tokens": True, "rows": [
        {"variant": "both (current)", "median_s": 1.243, "min_s": 1.181, "max_s": 1.404, "faults": 24528,
         "speedup_vs_before": 1.1231},
        {"variant": "neither (before)", "median_s": 1.396, "min_s": 1.301, "max_s": 1.495, "faults": 35840,
         "speedup_vs_before": 1.0}]}
    assert P.percall_ablation(r).splitlines() == [
        "| variant | median s (min–max) | minor page faults per run | speed-up vs neither |", "|---|---|---|---|",
        "| both (current) | 1.243 (1.181–1.404) | 24,528 | 1.12× |",
        "| neither (before) | 1.396 (1.301–1.495) | 35,840 | 1.00× |", "",
        "Tokens identical in every variant: yes."]


def test_vs_authors_renders_a_single_results_file_with_its_environment():
    x = {"batch": 1, "ours_median_s": 1.206, "authors_median_s": 1.696, "speedup": 1.41, "round_speedups": [1.29, 1.61],
         "identical_tokens": True}
    r = {"nfe": 16, "sde": x, "remask": {**x, "speedup": 2.53, "round_speedups": [2.32, 3.29]},
         "remask_b8": {**x, "batch": 8, "identical_tokens": False}, "environment": _ENV}
    lines = P.TABLES["cpu-vs-authors-2t"].render(r).splitlines()
    assert lines[2:5] == ["| SDE, NFE 16, batch 1 | 1.206 | 1.696 | **1.41×** (1.29–1.61) | yes |",
                          "| remasking, 16 steps, batch 1 | 1.206 | 1.696 | **2.53×** (2.32–3.29) | yes |",
                          "| remasking, 16 steps, batch 8 (per sample) | 1.206 | 1.696 | **1.41×** (1.29–1.61) | no (below) |"]
    assert lines[5] == "" and lines[6] == P.environment_line(_ENV)
