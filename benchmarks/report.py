"""Markdown summaries of benchmark results, and a section-preserving file writer.

LoCoMo and PrefEval write to the same document (``docs/benchmarks.md``); each run
replaces only its own marked section, so one run does not erase the other.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def _fmt(value: Any, digits: int = 3) -> str:
    """A number for a table cell; blanks for missing or NaN values."""
    if value is None:
        return ""
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.{digits}f}"
    return str(value)


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-flavoured Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_fmt(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _budget_rows(report: Mapping[str, Any], mode: str, path: Sequence[str]) -> list[list[Any]]:
    """One row per system: the metric at ``path`` inside each budget cell."""
    rows: list[list[Any]] = []
    for name, by_mode in report["results"].items():
        cells = by_mode.get(mode)
        if cells is None:
            continue
        row: list[Any] = [name]
        for b in report["budgets"]:
            value: Any = cells[str(b)]
            for key in path:
                value = value.get(key) if isinstance(value, Mapping) else None
            row.append(value)
        rows.append(row)
    return rows


def run_line(report: Mapping[str, Any]) -> str:
    """Commit, load average and torch threads of the run; systems not finished yet."""

    def load(values: Sequence[float]) -> str:
        return "/".join(f"{x:.2f}" for x in values)

    run = report.get("run")
    if not run:
        return ""
    threads = ", ".join(f"{k} {v}" for k, v in run.get("torch_threads", {}).items())
    text = (
        f"Run: commit `{run['commit']}`, load average (1/5/15 min) {load(run['load_avg'])} "
        f"at start, {load(run.get('load_avg_end', run['load_avg']))} at the end; "
        f"torch intra-op threads (set by the harness, the same for every system): {threads}."
    )
    pending = [n for n in report.get("systems", []) if n not in report["results"]]
    if pending:
        text += f" **Partial: still running or not finished: {', '.join(pending)}.**"
    return text


def locomo_markdown(report: Mapping[str, Any]) -> str:
    """Headline and secondary LoCoMo-ER@B tables for a :func:`run_locomo` result."""
    budgets = report["budgets"]
    bcols = [f"B={b}" for b in budgets]
    data = report["data"]
    parts = [
        "## LoCoMo-ER@B (evidence recall at a token budget)",
        "",
        f"Data: `{Path(data['path']).name}`, {len(data['conversations'])} conversations, "
        f"{data['n_turns']} turns, {data['n_questions']} scored questions "
        f"(categories {', '.join(str(c) for c in report['categories'])}: "
        + ", ".join(f"{k}={v}" for k, v in data["questions_by_category"].items())
        + "). Over-budget slices score 0. Tokens: cl100k.",
        "",
        run_line(report),
    ]
    for mode in report["modes"]:
        ceiling = report["ceiling"].get(mode, {})
        parts += [
            "",
            f"### Mode {mode}: ER-strict, (a) verbatim or (b) derived "
            f"(≤{report['max_derived_refs']} source turns)",
            "",
        ]
        if mode != "S":
            parts += [
                "Ceiling (evidence in the queried subjects): "
                f"strict {_fmt(ceiling.get('strict'))}, frac {_fmt(ceiling.get('frac'))}.",
                "",
            ]
        rows = _budget_rows(report, mode, ["strict"])
        for row in rows:
            row.append(report["er_auc"][row[0]][mode]["strict"])
        parts.append(table(["system", *bcols, "ER-AUC"], rows))
        parts += ["", f"Mode {mode}, (a) verbatim only, ER-strict:", ""]
        rows = _budget_rows(report, mode, ["verbatim", "strict"])
        for row in rows:
            row.append(report["er_auc"][row[0]][mode]["verbatim_strict"])
        parts.append(table(["system", *bcols, "ER-AUC"], rows))
        for metric in ("frac", "any", "session"):
            parts += ["", f"Mode {mode}, ER-{metric}:", ""]
            parts.append(table(["system", *bcols], _budget_rows(report, mode, [metric])))
        parts += ["", f"Mode {mode}, ER-strict by category (macro = mean of categories):", ""]
        parts.append(_category_table(report, mode))
        if _has_audited(report, mode):
            parts += ["", f"Mode {mode}, audited evidence (locomo-audit overlay), ER-strict:", ""]
            parts.append(
                table(["system", *bcols], _budget_rows(report, mode, ["audited", "strict"]))
            )
        parts += [
            "",
            f"Mode {mode}, slice size and latency (warm, CPU). Each question is asked at "
            "every budget in turn, smallest first; a system may reuse per-question work "
            "(the embedding baseline reuses the question vector within a mode), so cold-query "
            "cost shows in the smallest budget's row.",
            "",
        ]
        parts.append(_cost_table(report, mode))
    return "\n".join(parts) + "\n"


def _has_audited(report: Mapping[str, Any], mode: str) -> bool:
    first = str(report["budgets"][0])
    return any(
        "audited" in by_mode.get(mode, {}).get(first, {}) for by_mode in report["results"].values()
    )


def _category_table(report: Mapping[str, Any], mode: str) -> str:
    cats = [str(c) for c in report["categories"]]
    rows: list[list[Any]] = []
    for name, by_mode in report["results"].items():
        if mode not in by_mode:
            continue
        for b in report["budgets"]:
            cell = by_mode[mode][str(b)]
            by_cat = cell["by_category"]
            rows.append(
                [name, b, *[by_cat.get(c, {}).get("strict") for c in cats], cell["macro"]["strict"]]
            )
    return table(["system", "B", *[f"cat {c}" for c in cats], "macro"], rows)


def _cost_table(report: Mapping[str, Any], mode: str) -> str:
    rows: list[list[Any]] = []
    for name, by_mode in report["results"].items():
        if mode not in by_mode:
            continue
        for b in report["budgets"]:
            cell = by_mode[mode][str(b)]
            rows.append(
                [
                    name,
                    b,
                    _fmt(cell["mean_tokens"], 1),
                    cell["mean_tokens_over_B"],
                    _fmt(cell["p50_ms"], 2),
                    _fmt(cell["p95_ms"], 2),
                    cell["over_budget"],
                ]
            )
    return table(
        ["system", "B", "mean tokens", "tokens / B", "p50 ms", "p95 ms", "over budget"], rows
    )


def prefeval_markdown(report: Mapping[str, Any]) -> str:
    """Overall and per-topic PrefEval-PR@B tables for a :func:`run_prefeval` result."""
    settings = report["settings"]
    cols = [f"N={n}, B={b}" for n, b in settings]
    parts = [
        "## PrefEval-PR@B (preference recall under distractors)",
        "",
        f"{report['data']['n_users']} synthetic users over {len(report['data']['topics'])} topics; "
        f"distractors = other topics' preferences, `random.Random({report['seed']})`. "
        "Hit = preference text in the slice, or an item citing the preference event. "
        "Baselines see one line per candidate, `- <preference>`.",
        "",
        run_line(report),
        "",
        table(
            ["system", *cols],
            [
                [name, *[by[f"N{n}_B{b}"]["overall"] for n, b in settings]]
                for name, by in report["results"].items()
            ],
        ),
    ]
    for name, by in report["results"].items():
        parts += ["", f"Per topic, {name}:", ""]
        topics = report["data"]["topics"]
        parts.append(
            table(
                ["topic", *cols],
                [[t, *[by[f"N{n}_B{b}"]["by_topic"].get(t) for n, b in settings]] for t in topics],
            )
        )
    return "\n".join(parts) + "\n"


def write_markdown_section(path: Path, key: str, body: str) -> None:
    """Write body between ``<!-- bench:<key>:start/end -->`` markers in path.

    An existing section is replaced in place; otherwise the section is appended,
    so hand-written text around it survives.
    """
    start, end = f"<!-- bench:{key}:start -->", f"<!-- bench:{key}:end -->"
    block = f"{start}\n{body.rstrip()}\n{end}\n"
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    if start in text and end in text:
        head, rest = text.split(start, 1)
        _, tail = rest.split(end, 1)
        text = head + block + tail.lstrip("\n")
    else:
        text = (text.rstrip("\n") + "\n\n" if text.strip() else "") + block
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
