"""Medians and ranges over a set of runs (``run_set.py``), as tables for the docs.

    python benchmarks/report.py SET_DIR                  # the tables (Markdown)
    python benchmarks/report.py SET_DIR --update-docs    # rewrite the marked blocks
    python benchmarks/report.py SET_DIR --plots DIR      # the plots, with min-max bars

Every figure is given as the median over the set's runs and its range, the
lowest and highest run ("11.1x (10.2-11.5)"); never the best run alone. Figures
of a run are the medians of its interleaved windows (ratios: between those
medians), so the range shows how runs differ, not windows.

``--update-docs`` draws the plots into ``docs/_static`` and replaces each block
between ``<!-- report:NAME -->`` and ``<!-- /report:NAME -->`` in ``README.md``
and ``docs/performance.md`` with the table, bullets or figure ``NAME`` of this set
(see ``SECTIONS`` and ``FIGURES``), naming the set it came from.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import statistics
import sys
from collections.abc import Callable
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(_HERE)
DOCS = ("README.md", os.path.join("docs", "performance.md"))
SEP = "|"
TOKEN_ARRAY_SIDE = "zephon_jax %s, TokenArray"  # as bench.py names it
LEAN = "lean Python reference"
COPY = "contiguous copy"
GRAIN_POOL = "zephon_jax lanes in grain's mp_prefetch, 2 workers"
README_NO_WINDOW = "grain without window_shuffle (not the same pipeline)"
SKIPPED = {"rates"}  # per-window lists: a run's own spread, not a figure


# ----- a set of runs ------------------------------------------------------------------


def load_set(directory: str) -> dict[str, Any]:
    """``set.json`` and every run's figures: ``{"meta": ..., "runs": [{kind: results}]}``."""
    path = os.path.join(directory, "set.json")
    if not os.path.exists(path):
        raise SystemExit(
            f"{directory} has no set.json: make a set with "
            f"python benchmarks/run_set.py --runs 5 --out {directory}"
        )
    with open(path) as f:
        meta = json.load(f)
    runs = []
    for record in meta["runs"]:
        run = {}
        for kind in ("default", "fast"):
            if kind in record:
                with open(os.path.join(directory, record[kind])) as f:
                    run[kind] = json.load(f)
        runs.append(run)
    if not runs:
        raise SystemExit(f"{path} records no finished run")
    return {"meta": meta, "runs": runs}


def flatten(obj: Any, prefix: str = "") -> dict[str, float]:
    """Numeric leaves of nested dicts and lists as ``{"a|b|0": value}`` (booleans as 0/1)."""
    out: dict[str, float] = {}
    if isinstance(obj, dict):
        items = [(str(k), v) for k, v in obj.items() if k not in SKIPPED]
    elif isinstance(obj, list):
        items = [(str(i), v) for i, v in enumerate(obj)]
    elif isinstance(obj, (int, float)) and obj is not None:
        return {prefix: float(obj)}
    else:
        return out
    for key, value in items:
        out.update(flatten(value, f"{prefix}{SEP}{key}" if prefix else key))
    return out


@dataclasses.dataclass(frozen=True)
class Stat:
    """One figure over the runs: the median, the lowest and highest run, how many runs."""

    median: float
    lo: float
    hi: float
    n: int


def aggregate(runs: list[dict[str, Any]]) -> dict[str, Stat]:
    """Every figure of every run (``kind|case|...``) -> its median and min-max."""
    values: dict[str, list[float]] = {}
    for run in runs:
        for key, value in flatten(run).items():
            values.setdefault(key, []).append(value)
    return {
        k: Stat(statistics.median(v), min(v), max(v), len(v))
        for k, v in values.items()
        if all(x == x for x in v)  # no NaN
    }


def summary(agg: dict[str, Stat]) -> dict[str, dict[str, float]]:
    return {k: dataclasses.asdict(s) for k, s in sorted(agg.items())}


# ----- formatting ---------------------------------------------------------------------


def _fmt(stat: Stat | None, scale: float, spec: str, unit: str) -> str:
    if stat is None:
        return "n/a"
    m, lo, hi = (f"{v / scale:{spec}}" for v in (stat.median, stat.lo, stat.hi))
    spread = "" if stat.n == 1 or lo == hi else f" ({lo}-{hi})"
    return f"{m}{unit}{spread}"


def tokens(stat: Stat | None) -> str:
    return _fmt(stat, 1e6, ".1f", " M")


def ratio(stat: Stat | None) -> str:
    return _fmt(stat, 1, ".2f" if stat is not None and stat.median < 2 else ".1f", "x")


def share(stat: Stat | None) -> str:
    return _fmt(stat, 0.01, ".2f" if stat is not None and stat.median < 0.1 else ".0f", " %")


def fill(stat: Stat | None) -> str:
    return _fmt(stat, 1, ".3f", "")


def kilo(stat: Stat | None) -> str:
    return _fmt(stat, 1e3, ".1f" if stat is not None and stat.median < 1e4 else ".0f", " k")


def seconds(stat: Stat | None) -> str:
    return _fmt(stat, 1, ".2f", " s")


def millis(stat: Stat | None) -> str:
    return _fmt(stat, 1e-3, ".1f", " ms")


def kib(stat: Stat | None) -> str:
    return _fmt(stat, 1024, ".0f", " KiB")


def plain(stat: Stat | None, spec: str = ".0f", unit: str = "") -> str:
    return _fmt(stat, 1, spec, unit)


class Figures:
    """The set's aggregated figures, looked up by path parts (``None`` where absent)."""

    def __init__(self, agg: dict[str, Stat], meta: dict[str, Any], runs: list[dict]):
        self.agg, self.meta, self.runs = agg, meta, runs

    def __call__(self, *parts: str) -> Stat | None:
        return self.agg.get(SEP.join(parts))

    def has(self, kind: str, case: str) -> bool:
        return any(case in run.get(kind, {}) for run in self.runs)

    def first(self, kind: str, *parts: str) -> Any:
        """A non-numeric value (settings) from the first run that has it."""
        for run in self.runs:
            value: Any = run.get(kind)
            for p in parts:
                value = value.get(p) if isinstance(value, dict) else None
            if value is not None:
                return value
        return None


# ----- tables -------------------------------------------------------------------------


def environment_text(fig: Figures) -> str:
    """One paragraph: the runs, the machine and the versions the figures hold for."""
    env = fig.meta["environment"]
    v = env["versions"]
    loads = [
        run[kind]["machine"]["load_average_at_start"][0]
        for run in fig.runs
        for kind in ("default", "fast")
        if kind in run
    ]
    mode = "" if fig.meta.get("mode") == "full" else " (quick mode: tiny windows, not figures)"
    return (
        f"{len(fig.runs)} runs{mode}, each in fresh processes, started "
        f"{fig.meta['started']}: {env['cpu_model']}, {env['cpu_count']} cores, "
        f"{env['platform']}; Python {env['python']}, zephon_jax {v['zephon_jax']}, "
        f"Grain {v['grain']}, numpy {v['numpy']}, jax {v['jax']}, jaxlib {v['jaxlib']}, "
        f"numba {v['numba']}; one-minute load average at the start of each process "
        f"{min(loads):.1f}-{max(loads):.1f}."
    )


def documented_kind(fig: Figures, case: str) -> str:
    """The process a documented pipeline's figures come from: the kernels-on one where
    the set ran it there (the LLM pipeline takes the column path on the default
    install), else the general path's."""
    return "fast" if fig.has("fast", case) else "default"


def documented_table(fig: Figures) -> str:
    """The documented pipelines on the default install."""
    lines = [
        "| pipeline | zephon_jax | Grain | ratio | fill (zephon_jax / Grain) |",
        "|---|---:|---:|---:|---:|",
    ]
    labels = {
        "llm": 'LLM: `mix(TokenStores, unit="tokens") -> shuffle -> split -> pack -> '
        "to_training -> batch(64)`",
        "llm256": "the same at `batch(256)`",
        "readme": "README example: `mix -> shuffle -> filter -> split -> pack -> "
        "window_shuffle -> batch(64)`",
    }
    for case, label in labels.items():
        kind = documented_kind(fig, case)
        if not fig.has(kind, case):
            continue
        z, g = (kind, case, "sides", "zephon_jax"), (kind, case, "sides", "grain")
        lines.append(
            f"| {label} | {tokens(fig(*z, 'rate_median'))} | {tokens(fig(*g, 'rate_median'))} | "
            f"{ratio(fig(kind, case, 'ratio_to_grain'))} | "
            f"{fill(fig(*z, 'fill'))} / {fill(fig(*g, 'fill'))} |"
        )
    plain_grain = fig("default", "readme", "sides", README_NO_WINDOW, "rate_median")
    if plain_grain is not None:
        lines.append(
            "\nGrain's `WindowShuffleIterDataset` permutes each window with one `index_shuffle` "
            "call per element, slow for a window of 16; the same Grain pipeline without the "
            f"window shuffle (not the same batches) made {tokens(plain_grain)} real tokens/s "
            "in the same windows."
        )
    return "\n".join(lines)


def _packing_cases(fig: Figures, kind: str) -> list[tuple[str, tuple[str, ...], str, str]]:
    """(label, path, method, Grain bins text) of each packing case in ``kind``'s runs."""
    cases = []
    for key in ("B=64", "B=256"):
        if fig("default" if kind == "default" else kind, "packing", key, "sides",
               "grain first_fit", "rate_median") is not None:  # fmt: skip
            b = int(key[2:])
            cases.append(
                (
                    f"log-normal, split, {key}",
                    ("packing", key),
                    "best_fit",
                    f"zephon_jax 32 open rows per lane x {b} lanes; Grain {b} bins",
                )  # fmt: skip
            )
    if fig(kind, "uniform", "sides", "grain first_fit", "rate_median") is not None:
        cases.append(
            (
                "uniform 1..2048, first fit, B=32",
                ("uniform",),
                "first_fit",
                "zephon_jax 32 open rows per lane x 32 lanes; Grain 32 bins",
            )  # fmt: skip
        )
    return cases


def packing_table(fig: Figures) -> str:
    """Packing on the default install: the documents as a list, zephon_jax's general path."""
    lines = [
        "| case | open rows | zephon_jax | Grain first fit | Grain best fit | ratio (first / best "
        "fit) | lean Python reference | share of the reference | share of contiguous copy |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, path, method, bins in _packing_cases(fig, "default"):
        s = ("default", *path, "sides")
        z = f"zephon_jax {method}"
        best = fig("default", *path, "ratio_to_grain_best_fit")
        lines.append(
            f"| {label} | {bins} | {tokens(fig(*s, z, 'rate_median'))} "
            f"(fill {fill(fig(*s, z, 'fill'))}) | {tokens(fig(*s, 'grain first_fit', 'rate_median'))}"
            f" ({fill(fig(*s, 'grain first_fit', 'fill'))}) | "
            + (
                f"{tokens(fig(*s, 'grain best_fit', 'rate_median'))} "
                f"({fill(fig(*s, 'grain best_fit', 'fill'))})"
                if best
                else ""
            )
            + f" | {ratio(fig('default', *path, 'ratio_to_grain_first_fit'))}"
            + (f" / {ratio(best)}" if best else "")
            + f" | {tokens(fig(*s, LEAN, 'rate_median'))} | "
            f"{share(fig('default', *path, 'share_of_lean_reference', z))} (Grain "
            f"{share(fig('default', *path, 'share_of_lean_reference', 'grain first_fit'))}) | "
            f"{share(fig('default', *path, 'share_of_copy', z))} (Grain "
            f"{share(fig('default', *path, 'share_of_copy', 'grain first_fit'))}) |"
        )
    return "\n".join(lines)


def fast_table(fig: Figures) -> str:
    """Compiled: the same documents as a TokenArray, packed by the compiled kernels."""
    lines = [
        "| case | zephon_jax, TokenArray, compiled | Grain first fit | ratio (first / best fit) "
        "| share of the lean Python reference | share of contiguous copy |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for label, path, method, _ in _packing_cases(fig, "fast"):
        s = ("fast", *path, "sides")
        t = TOKEN_ARRAY_SIDE % method
        if fig(*s, t, "rate_median") is None:
            continue
        best = fig("fast", *path, "token_array_ratio_to_grain_best_fit")
        lines.append(
            f"| {label} | {tokens(fig(*s, t, 'rate_median'))} (fill {fill(fig(*s, t, 'fill'))}) | "
            f"{tokens(fig(*s, 'grain first_fit', 'rate_median'))} | "
            f"{ratio(fig('fast', *path, 'token_array_ratio_to_grain_first_fit'))}"
            + (f" / {ratio(best)}" if best else "")
            + f" | {share(fig('fast', *path, 'share_of_lean_reference', t))} | "
            f"{share(fig('fast', *path, 'share_of_copy', t))} |"
        )
    return "\n".join(lines)


def lanes_table(fig: Figures, kind: str, which: str) -> str:
    lines = [
        "| lanes | real tokens/s | vs fewest lanes | RSS per lane | state per lane | "
        "`get_state` | restore, fresh process | restore, warm | exact |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    rows = fig.first(kind, which, "rows") or []
    for i, r in enumerate(rows):
        p = (kind, which, "rows", str(i))
        exact = fig(*p, "restore_exact")
        lines.append(
            f"| {r['num_lanes']} | {tokens(fig(*p, 'tokens_per_s'))} | "
            f"{ratio(fig(*p, 'speed_vs_fewest_lanes'))} | {kib(fig(*p, 'rss_bytes_per_lane'))} | "
            f"{plain(fig(*p, 'state_bytes_per_lane'), '.0f', ' B')} | "
            f"{millis(fig(*p, 'get_state_s'))} | {seconds(fig(*p, 'restore_fresh_process_s'))} | "
            f"{seconds(fig(*p, 'restore_warm_s'))} | "
            f"{'yes' if exact and exact.lo == 1 else 'NO'} |"
        )
    return "\n".join(lines)


def workers_table(fig: Figures) -> str:
    names = [n for n in ("heavy map", "heavy map + pack") if fig.has("default", "workers")]
    sides: list[str] = []
    for n in names:
        sides += [s for s in fig.first("default", "workers", n, "sides") or {} if s not in sides]
    header = [s.replace("workers=", "zephon_jax, workers=") for s in sides]
    lines = [
        "| pipeline | " + " | ".join(header) + " | the map alone, 2 processes over 1 |",
        "|---|" + "---:|" * (len(sides) + 1),
    ]
    for n in names:
        cells = []
        unit = "records/s" if n == "heavy map" else "tokens/s"
        for side in sides:
            rate = fig("default", "workers", n, "sides", side, "rate_median")
            if rate is None:
                cells.append("")
                continue
            value = kilo(rate) if rate.median < 1e6 else tokens(rate)
            if side != "workers=0":
                speedup = fig("default", "workers", n, "speedup_" + _worker_label(side))
                value += f" ({ratio(speedup)})"
            cells.append(f"{value} {unit}" if side == "workers=0" else value)
        cells.append(ratio(fig("default", "workers", n, "process_floor", "speedup_2")))
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def workers_cpu_table(fig: Figures) -> str:
    """CPU milliseconds per batch of all the processes together (and of the loader)."""
    names = [n for n in ("heavy map", "heavy map + pack") if fig.has("default", "workers")]
    sides: list[str] = []
    for n in names:
        sides += [s for s in fig.first("default", "workers", n, "sides") or {} if s not in sides]
    header = [s.replace("workers=", "zephon_jax, workers=") for s in sides]
    lines = ["| pipeline | " + " | ".join(header) + " |", "|---|" + "---:|" * len(sides)]
    for n in names:
        cells = []
        for side in sides:
            p = ("default", "workers", n, "sides", side)
            total = fig(*p, "cpu_s_per_batch_total")
            cells.append(
                "" if total is None
                else f"{millis(total)} (loader {millis(fig(*p, 'cpu_s_per_batch_loader'))})"
            )  # fmt: skip
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _worker_label(side: str) -> str:
    return side.split("=")[1] if side.startswith("workers=") else "grain_pool_2"


def tokenize_table(fig: Figures) -> str:
    kinds = [k for k in (fig.first("default", "tokenize") or {}) if k != "settings"]
    if not kinds:
        return ""
    names = list(fig.first("default", "tokenize", kinds[0], "sides"))
    lines = ["| tokenizer | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    ratio_keys = {
        "zephon_jax map, one by one": "ratio_to_one_by_one",
        "grain map, read_threads=0": "ratio_to_grain",
        "grain map, 16 read threads": "ratio_to_grain_threads",
        "grain batch -> map(encode batch) -> unbatch": "ratio_to_grain_batched",
    }
    for kind in kinds:
        cells = []
        for name in names:
            p = ("default", "tokenize", kind, "sides", name)
            cell = f"{kilo(fig(*p, 'records_per_s'))} rec/s"
            if name in ratio_keys:
                cell += f" (tokenize {ratio(fig('default', 'tokenize', kind, ratio_keys[name]))})"
            cells.append(cell)
        lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def map_batch_text(fig: Figures) -> str:
    s = ("default", "map_batch", "sides")
    return (
        f'`map(identity) + batch(128)` over `{{"x": np.int64}}` records: zephon_jax '
        f"{kilo(fig(*s, 'zephon_jax', 'rate_median'))} records/s, Grain "
        f"{kilo(fig(*s, 'grain', 'rate_median'))} "
        f"({ratio(fig('default', 'map_batch', 'ratio_to_grain'))})."
    )


def headline(fig: Figures) -> str:
    """The README's bullets: the general path first, compiled packing labelled as such."""
    d = ("default",)
    out = [
        f"Medians over runs, with the lowest and highest run in brackets. {environment_text(fig)}\n"
    ]
    if fig.has(documented_kind(fig, "llm"), "llm"):
        d = (documented_kind(fig, "llm"),)
        out.append(
            "- **The documented LLM pipeline**, default install (two `TokenStore`s mixed by "
            "tokens, `shuffle -> split(2048) -> pack(2048) -> to_training -> batch(64)`): "
            f"zephon_jax {tokens(fig(*d, 'llm', 'sides', 'zephon_jax', 'rate_median'))} real "
            f"tokens/s, Grain as MaxText configures it "
            f"{tokens(fig(*d, 'llm', 'sides', 'grain', 'rate_median'))}: "
            f"**{ratio(fig(*d, 'llm', 'ratio_to_grain'))}**."
        )
    d = ("default",)
    if fig.has("default", "readme"):
        out.append(
            "- **The README example** (mixture, filter, split, pack, window shuffle; rows of "
            "2048, `batch(64)`), default install: "
            f"{tokens(fig(*d, 'readme', 'sides', 'zephon_jax', 'rate_median'))} against Grain's "
            f"{tokens(fig(*d, 'readme', 'sides', 'grain', 'rate_median'))}: "
            f"**{ratio(fig(*d, 'readme', 'ratio_to_grain'))}**; Grain's window shuffle is slow on "
            "windows this small: without it Grain makes "
            f"{tokens(fig(*d, 'readme', 'sides', README_NO_WINDOW, 'rate_median'))} "
            "(other batches)."
        )
    if fig.has("default", "packing"):
        p = ("default", "packing")
        out.append(
            "- **Packing alone** (`shuffle -> split -> pack -> batch`, documents as a list, "
            "default install; zephon_jax 32 open rows per lane x B lanes, Grain B bins): "
            f"{ratio(fig(*p, 'B=64', 'ratio_to_grain_first_fit'))} Grain's first fit at `B=64`, "
            f"{ratio(fig(*p, 'B=256', 'ratio_to_grain_first_fit'))} at `B=256`; "
            f"{share(fig(*p, 'B=64', 'share_of_lean_reference', 'zephon_jax best_fit'))} of a "
            "lean Python reference that keeps no lineage or state."
        )
    if fig.has("fast", "packing"):
        p = ("fast", "packing")
        out.append(
            "- **Compiled packing** (numba, in the default install), over a "
            "`TokenArray` and with `pack` last (the bare pipeline above): "
            f"{ratio(fig(*p, 'B=64', 'token_array_ratio_to_grain_first_fit'))} Grain's first "
            f"fit at `B=64`, {ratio(fig(*p, 'B=256', 'token_array_ratio_to_grain_first_fit'))}"
            " at `B=256`."
        )
    if fig.has("default", "workers"):
        w = ("default", "workers")
        out.append(
            f"- **Workers** on {fig.meta['environment']['cpu_count']} cores: two workers "
            f"{ratio(fig(*w, 'heavy map', 'speedup_2'))} on a Python-heavy map, "
            f"{ratio(fig(*w, 'heavy map + pack', 'speedup_2'))} on the map plus packing; the "
            "map alone in two plain processes "
            f"{ratio(fig(*w, 'heavy map', 'process_floor', 'speedup_2'))} of one."
        )
    if fig.has("default", "tokenize"):
        t = ("default", "tokenize", "tokenizers")
        out.append(
            "- **Tokenization** (`tokenizers` BPE): `tokenize` "
            f"{ratio(fig(*t, 'ratio_to_one_by_one'))} one call per record, "
            f"{ratio(fig(*t, 'ratio_to_grain_batched'))} Grain encoding batches "
            "(`batch -> map(encode_batch) -> unbatch`)."
        )
    return "\n".join(out)


SECTIONS: dict[str, Callable[[Figures], str]] = {
    "environment": environment_text,
    "headline": headline,
    "documented": documented_table,
    "packing": packing_table,
    "fast": fast_table,
    "lanes": lambda fig: lanes_table(fig, "default", "lanes"),
    "lanes_token_array": lambda fig: lanes_table(fig, "fast", "lanes_token_array"),
    "workers": workers_table,
    "workers_cpu": workers_cpu_table,
    "tokenize": tokenize_table,
    "map_batch": map_batch_text,
}


# Plots the docs show: block name -> (file under docs/_static, alt text, caption).
FIGURES = {
    "figure_documented": (
        "bench_documented.png",
        "Real tokens per second of the documented pipelines, zephon_jax and Grain",
        "The documented pipelines on the default install; bars: median, whiskers: lowest and "
        "highest run.",
    ),
    "figure_packing": (
        "bench_vs_grain.png",
        "Real tokens per second of zephon_jax and Grain for three packing cases",
        "Real (non-padding) tokens/s; dashed: the lean Python reference.",
    ),
    "figure_copy": (
        "bench_copy.png",
        "Batches per second as a share of copying the batch's bytes",
        "Speed as a share of a contiguous copy of the batch's bytes (log scale).",
    ),
    "figure_lanes": (
        "bench_lanes.png",
        "Tokens per second, memory per lane and restore time against the lane count",
        "The same batches made by more lanes; restore in a fresh process.",
    ),
    "figure_workers": (
        "bench_workers.png",
        "Speed with 0, 1 and 2 workers, and zephon_jax lanes in Grain's worker pool",
        "Speed over no workers; dashed: the map alone in two plain processes over one.",
    ),
    "figure_tokenize": (
        "bench_tokenize.png",
        "Records per second of tokenizing in the pipeline and in Grain",
        "Records/s of the tokenize case, per tokenizer.",
    ),
}


def figure_block(name: str, static: str) -> str:
    """The MyST figure of block ``name``, or a note when its plot is not in ``static``."""
    file, alt, caption = FIGURES[name]
    if not os.path.exists(os.path.join(static, file)):
        return f"_(plot pending: `{file}` is drawn by `report.py SET --update-docs`)_"
    return f"```{{figure}} _static/{file}\n:alt: {alt}\n:width: 100%\n\n{caption}\n```"


def markdown(fig: Figures) -> str:
    return "\n\n".join(f"### {name}\n\n{fn(fig)}" for name, fn in SECTIONS.items())


def update_text(text: str, fig: Figures, set_name: str, static: str = "") -> str:
    """``text`` with every ``report:NAME`` block replaced by section ``NAME`` of ``fig`` (or
    by the figure ``NAME`` whose plot is in the directory ``static``)."""

    def block(m: re.Match) -> str:
        name = m.group(1)
        if name in FIGURES:
            body = figure_block(name, static)
        elif name in SECTIONS:
            body = SECTIONS[name](fig)
        else:
            known = ", ".join([*SECTIONS, *FIGURES])
            raise SystemExit(f"unknown report block {name!r}; known: {known}")
        return (
            f"<!-- report:{name} -->\n<!-- generated by benchmarks/report.py from {set_name} -->"
            f"\n{body}\n<!-- /report:{name} -->"
        )

    return re.sub(r"<!-- report:(\w+) -->.*?<!-- /report:\1 -->", block, text, flags=re.S)


def update_docs(fig: Figures, set_name: str, root: str = REPO) -> list[str]:
    """Draws the plots into ``docs/_static`` and rewrites the marked blocks of the docs."""
    if _HERE not in sys.path:
        sys.path.insert(0, _HERE)
    import plots as plots_mod

    static = os.path.join(root, "docs", "_static")
    written = plots_mod.draw_all(fig, static)
    for rel in DOCS:
        path = os.path.join(root, rel)
        with open(path) as f:
            text = f.read()
        new = update_text(text, fig, set_name, static)
        if new != text:
            with open(path, "w") as f:
                f.write(new)
            written.append(path)
    return written


def figures(directory: str) -> Figures:
    data = load_set(directory)
    return Figures(aggregate(data["runs"]), data["meta"], data["runs"])


def write_set_report(directory: str, plots: bool = True) -> list[str]:
    """``summary.json``, ``report.md`` and (``plots``) ``plots/*.png`` of the set."""
    fig = figures(directory)
    out = []
    path = os.path.join(directory, "summary.json")
    with open(path, "w") as f:
        json.dump({"runs": len(fig.runs), "figures": summary(fig.agg)}, f, indent=1)
    out.append(path)
    path = os.path.join(directory, "report.md")
    with open(path, "w") as f:
        f.write(markdown(fig) + "\n")
    out.append(path)
    if plots:
        import plots as plots_mod

        out += plots_mod.draw_all(fig, os.path.join(directory, "plots"))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("set", help="a directory written by run_set.py")
    parser.add_argument("--update-docs", action="store_true", help="rewrite the marked blocks")
    parser.add_argument("--plots", metavar="DIR", help="draw the plots into DIR")
    args = parser.parse_args(argv)
    fig = figures(args.set)
    print(markdown(fig))
    if args.update_docs:
        name = os.path.relpath(os.path.abspath(args.set), REPO)
        if name.startswith(".."):  # a set outside the repository: named by its folder
            name = os.path.basename(os.path.abspath(args.set))
        for path in update_docs(fig, name):
            print(f"wrote {path}", file=sys.stderr)
    if args.plots:
        if _HERE not in sys.path:
            sys.path.insert(0, _HERE)
        import plots as plots_mod

        for path in plots_mod.draw_all(fig, args.plots):
            print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
