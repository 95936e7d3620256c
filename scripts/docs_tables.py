"""Every number table in docs/ traced to the command and environment that made it; the cheap ones re-made.

    python scripts/docs_tables.py --lint            every number table names its command and environment record
                                                    (or says it predates the record); exit 1 naming the ones that
                                                    do not
    python scripts/docs_tables.py --check           re-make the cheap registered tables (about a minute on a 2-core
                                                    CPU) and exit 1 when a value leaves the 95 % interval the docs
                                                    state for it
    python scripts/docs_tables.py --write [NAME]    re-make registered tables and replace their blocks in docs/
    python scripts/docs_tables.py --write-pages [NAME]
                                                    render the benchmark pages' tables (docs/benchmarks/*.md) from
                                                    the results in benchmarks/results/ into their blocks
    python scripts/docs_tables.py --check-pages     re-render those tables (JSON only, under a second) and exit 1
                                                    naming each block that differs from its results

The benchmark pages' tables and their renderers are in `page_tables.py` beside this script; `--lint` also fails on
a measurement table on those pages that is neither rendered from results nor listed there as not generated (with
the reason), and prints the listed ones.

A registered table sits in its document between ``<!-- docs-table: NAME -->`` and ``<!-- /docs-table -->``; each
cell is ``value [low, high]`` (the 95 % bootstrap interval over prompts, `dsl_llada.stats`).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import page_tables  # beside this script (scripts/ is not a package)

ROOT = Path(__file__).resolve().parents[1]
"""The checkout this script runs from (the tables document it)."""
DOCS = ROOT / "docs"
RESULTS = ROOT / "benchmarks" / "results"
_CELL = re.compile(r"^\s*(-?[\d.]+) \[(-?[\d.]+), (-?[\d.]+)\]\s*$")
COMMAND_MARKS = ("Command:", "```bash", "`dsl-llada ", "`python ", "Measured with `", "command:")
ENVIRONMENT_MARKS = ("Environment:", "predates the environment record")


@dataclass(frozen=True)
class Table:
    name: str
    doc: str
    """File under docs/."""
    title: str
    make: Callable[[], tuple[str, dict[tuple[str, str], float]]]
    """Returns (the block's Markdown, {(row label, column header): value})."""


def _toy_examples() -> tuple[Any, Any]:
    from dsl_llada.toy.demo import Demo, DemoConfig

    demo = Demo(DemoConfig.preset(quick=True), ROOT / ".docs-tables-unused", progress=False, echo=lambda *_: None)
    _, evals = demo.corpora()
    return demo, evals


_COLUMNS = [("ppl", "PPL", ".2f"), ("in_support", "in-support %", ".1f"), ("len", "Len", ".2f"),
            ("premature_eos%", "premature EOS %", ".1f"), ("rep", "Rep %", ".2f")]


def _render(rows: list[dict[str, Any]], label: str, intro: str, command: str, env: dict[str, Any]
            ) -> tuple[str, dict[tuple[str, str], float]]:
    from dsl_llada.runtime.environment import environment_footer
    from dsl_llada.eval.report import markdown_table

    values = {(str(r[label]), h): float(r[k]) for r in rows for k, h, _ in _COLUMNS if r.get(k) is not None}
    text = "\n".join([intro, "", f"Command: `{command}`", "",
                      markdown_table(rows, [(label, label, ""), *_COLUMNS]), "", environment_footer(env)])
    return text, values


def make_toy_reference() -> tuple[str, dict[tuple[str, str], float]]:
    """The world's own samples for the quick demo's held-out prompts, scored exactly (no model: seconds)."""
    from dsl_llada.runtime.environment import environment_record, finish_record
    from dsl_llada.toy.evaluate import aggregate, score_record

    env = environment_record(device="cpu", seeds={"world": 0})
    demo, evals = _toy_examples()
    recs = [score_record(demo.world, ex, ex.response, method="world", nfe=0, seed=None, index=i, forward_passes=0)
            for i, ex in enumerate(evals)]
    rows = [dict(r, label=f"world, {r['task']}") for r in aggregate(recs)]
    return _render(rows, "label", f"The toy world's own samples for the quick demo's {len(evals)} held-out prompts, "
                   "scored exactly (the reference every sampler is compared with).",
                   "python scripts/docs_tables.py --write toy-reference", finish_record(env))


def make_toy_untrained() -> tuple[str, dict[tuple[str, str], float]]:
    """DSL-SDE and LLaDA remasking at NFE 8 on a seeded, untrained demo-shaped model (exercises the samplers and the
    scoring end to end in seconds; the values are those of a random model, not of the method)."""
    import torch

    from dsl_llada.config import ConverterConfig, DSLConfig
    from dsl_llada.runtime.environment import environment_record, finish_record
    from dsl_llada.core.model import DSLModel
    from dsl_llada.toy.evaluate import Method, aggregate, sample_records

    env = environment_record(device="cpu", dtype=torch.float32, seeds={"init": 0, "sampling": 0})
    demo, evals = _toy_examples()
    base = demo._fresh_backbone().eval()
    dsl = DSLModel.convert(demo._copy_backbone(base), DSLConfig(converter=ConverterConfig(
        noise_dim=demo.cfg.noise_dim, beta_init=1.0, noise_seed=0))).eval()
    methods = [Method("DSL-SDE", "dsl", "sde"), Method("LLaDA", "base", "remask")]
    recs = sample_records({"base": base, "dsl": dsl}, demo.world, demo.tok, evals, methods, [8],
                          gen_length=demo.gen_length, batch_size=24, seed=0)
    rows = [dict(r, label=f"{r['method']}, {r['task']}") for r in aggregate(recs)]
    return _render(rows, "label", f"DSL-SDE and LLaDA remasking at NFE 8 on a seeded *untrained* demo-shaped model, "
                   f"the quick demo's {len(evals)} held-out prompts (a cheap end-to-end check of the samplers and "
                   "the exact scoring; the values describe a random model, not the method).",
                   "python scripts/docs_tables.py --write toy-untrained", finish_record(env))


TABLES = {t.name: t for t in (
    Table("toy-reference", "reproducibility.md", "Toy world reference", make_toy_reference),
    Table("toy-untrained", "reproducibility.md", "Untrained toy model, NFE 8", make_toy_untrained),
)}


def _block_re(name: str) -> re.Pattern[str]:
    return re.compile(rf"<!-- docs-table: {re.escape(name)} -->\n(.*?)<!-- /docs-table -->", re.S)


def stated_values(text: str) -> dict[tuple[str, str], tuple[float, float, float]]:
    """{(row label, header): (value, low, high)} of the first Markdown table in `text` (cells 'v [lo, hi]')."""
    lines = [ln for ln in text.splitlines() if ln.startswith("|")]
    if len(lines) < 3:
        return {}
    headers = [h.strip() for h in lines[0].strip("|").split("|")]
    out = {}
    for ln in lines[2:]:
        cells = [c.strip() for c in ln.strip().strip("|").split("|")]
        for h, c in zip(headers[1:], cells[1:]):
            m = _CELL.match(c)
            if m:
                value, low, high = (float(x) for x in m.groups())
                out[(cells[0], h)] = (value, low, high)
    return out


def check_table(table: Table) -> list[str]:
    """Problems: values of the re-made table outside the intervals the document states (or missing)."""
    doc = (DOCS / table.doc).read_text()
    m = _block_re(table.name).search(doc)
    if m is None:
        return [f"{table.doc}: no block for table {table.name!r} (run --write {table.name})"]
    stated = stated_values(m.group(1))
    _, values = table.make()
    problems = []
    for key, (_, lo, hi) in sorted(stated.items()):
        if key not in values:
            problems.append(f"{table.name}: {key} is no longer produced")
            continue
        decimals = max(len(str(x).partition(".")[2]) for x in (lo, hi))
        slack = 0.5 * 10 ** -decimals  # the docs round the interval's ends
        if not lo - slack <= values[key] <= hi + slack:
            problems.append(f"{table.name}: {key[0]} / {key[1]} = {values[key]:.4g} is outside the stated "
                            f"interval [{lo}, {hi}]")
    if not stated:
        problems.append(f"{table.name}: the block in {table.doc} states no intervals")
    return problems


def write_table(table: Table) -> None:
    from dsl_llada.artifacts.atomic import atomic_write_text

    text, _ = table.make()
    block = f"<!-- docs-table: {table.name} -->\n{text.strip()}\n<!-- /docs-table -->"
    path = DOCS / table.doc
    doc = path.read_text() if path.exists() else ""
    pattern = _block_re(table.name)
    doc = pattern.sub(lambda _: block, doc, count=1) if pattern.search(doc) else \
        doc.rstrip() + f"\n\n### {table.title}\n\n{block}\n"
    atomic_write_text(path, doc.rstrip() + "\n")


_NUMERIC = re.compile(r"^[*~≈<>=+\-–−]*\s*[\d.,]+\s*(%|x|×|s|ms|MiB|GB|k)?[*]*(\s*[(\[/].*)?$")


def _has_measurement_table(section: list[str]) -> bool:
    """A Markdown table whose value cells (all but the first column) are mostly numbers: a measurement, not a
    reference table of options, defaults or endpoints."""
    rows = [ln for ln in section if ln.startswith("|") and not re.match(r"^\|[-:| ]+\|\s*$", ln)]
    cells = [c.strip() for ln in rows[1:] for c in ln.strip().strip("|").split("|")[1:]]
    cells = [c for c in cells if c and c not in ("–", "-")]
    return len(cells) >= 4 and sum(bool(_NUMERIC.match(c)) for c in cells) >= 0.6 * len(cells)


def lint(docs: Path = DOCS) -> list[str]:
    """Number tables whose section (from its heading to the next) names no command or no environment record."""
    problems = []
    for path in sorted(docs.rglob("*.md")):  # the benchmark pages under docs/benchmarks/ included
        lines = path.read_text().splitlines()
        starts = [i for i, ln in enumerate(lines) if ln.startswith("#")] + [len(lines)]
        for a, b in zip([0, *starts], [*starts, len(lines)]):
            section = lines[a:b]
            if not _has_measurement_table(section):
                continue
            text = "\n".join(section)
            missing = [w for w, marks in (("command", COMMAND_MARKS), ("environment", ENVIRONMENT_MARKS))
                       if not any(m in text for m in marks)]
            if missing:
                problems.append(f"{path.relative_to(docs.parent)}:{a + 1}: table without {' and '.join(missing)} "
                                f"({(section[0] if section else '').strip()[:60]!r})")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python scripts/docs_tables.py", description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--check", action="store_true", help="re-make the cheap tables; fail when a value leaves its interval")
    g.add_argument("--lint", action="store_true", help="every number table names its command and environment")
    g.add_argument("--write", nargs="*", metavar="NAME", help=f"re-make tables into docs/ ({', '.join(TABLES)}; "
                                                               "default all)")
    g.add_argument("--check-pages", action="store_true",
                   help="re-render the benchmark pages' tables from benchmarks/results/; fail when a block differs")
    g.add_argument("--write-pages", nargs="*", metavar="NAME",
                   help="render the benchmark pages' tables from benchmarks/results/ into docs/benchmarks/ (default all)")
    ap.add_argument("--docs", type=Path, default=None,
                    help="the docs folder (default: docs/ of the checkout this script runs from)")
    ap.add_argument("--results", type=Path, default=RESULTS,
                    help="the benchmark results folder (default: benchmarks/results/ of the checkout)")
    a = ap.parse_args(argv)
    global DOCS
    if a.docs is not None:
        DOCS = a.docs
    if not DOCS.is_dir():
        print(f"error: docs folder {str(DOCS)!r} does not exist; run from a checkout or pass --docs DIR", file=sys.stderr)
        return 2
    if not a.results.is_dir():
        print(f"error: results folder {str(a.results)!r} does not exist; pass --results DIR", file=sys.stderr)
        return 2
    if a.lint:
        page_problems, notes = page_tables.lint_pages(DOCS, _has_measurement_table)
        for note in notes:
            print(note)
        problems = lint(DOCS) + page_problems
    elif a.check_pages:
        problems = page_tables.check_pages(DOCS, a.results)
    elif a.write_pages is not None:
        unknown = [n for n in a.write_pages if n not in page_tables.TABLES]
        if unknown:
            print(f"error: unknown page table(s) {unknown}; known: {sorted(page_tables.TABLES)}", file=sys.stderr)
            return 2
        try:
            changed = page_tables.write_pages(DOCS, a.results, a.write_pages or None)
        except ValueError as e:
            print(f"error: {e}; add the block's markers where the table belongs", file=sys.stderr)
            return 2
        print(f"wrote {len(changed)} of {len(a.write_pages or page_tables.TABLES)} page table(s) that differed"
              + (f": {', '.join(changed)}" if changed else ""))
        return 0
    elif a.check:
        problems = [p for t in TABLES.values() for p in check_table(t)]
    else:
        unknown = [n for n in a.write if n not in TABLES]
        if unknown:
            print(f"error: unknown table(s) {unknown}; known: {sorted(TABLES)}", file=sys.stderr)
            return 2
        for n in a.write or list(TABLES):
            write_table(TABLES[n])
            print(f"wrote {n} into docs/{TABLES[n].doc}")
        return 0
    for p in problems:
        print(p)
    print(f"{'FAIL' if problems else 'ok'}: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
