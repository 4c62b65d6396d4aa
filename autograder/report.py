"""The grading report: one HTML page for the class, one per student, plots as PNG files beside them.

    report/index.html            every student's score per step, then per step: the score of each
                                 student, score distribution, per-test pass rates, perf (GPU tier), table
    report/students/<name>.html  feedback: each test, its points, the teaching line of a failure,
                                 the points and comments given by hand
    report/*.png                 the plots (files, never base64)

Feedback shows the error's name and the check's "likely cause" line (or the first line of the
message), never the source of a hidden test nor a seed. Manual grades and comments come from the
workspace's gradebook (``manual.py``) whenever a workspace is given, so every command's outputs agree.
"""
from __future__ import annotations

import csv
import html
import json
import re
import time
from collections import defaultdict
from pathlib import Path

from . import manual
from .model import Result

CSS = """body{font-family:system-ui,sans-serif;max-width:70em;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:.3em .6em;text-align:left;vertical-align:top}
th{background:#f3f3f3}.pass{color:#176c2e}.fail{color:#a11}.muted{color:#777}img{max-width:100%;margin:.5em 0}
code{background:#f6f6f6;padding:0 .2em}.comment{white-space:pre-wrap;font-style:italic}"""


def _e(x) -> str:
    return html.escape(str(x))


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "_"


def _page(title: str, body: str) -> str:
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{_e(title)}</title>"
            f"<style>{CSS}</style></head><body><h1>{_e(title)}</h1>{body}</body></html>\n")


#: The class plot of every student's score per step (the class page's first plot).
OVERVIEW = "scores_by_step.png"


def _overview(results: list[Result], out: Path, plt) -> str | None:
    """Students x steps, coloured by the share of the step's points scored, each cell labelled
    with its score: the whole class at a glance. Returns the file name (None: nothing graded)."""
    import numpy as np

    steps = sorted({r.assignment for r in results})
    students = sorted({r.student for r in results})
    if not steps:
        return None
    frac = np.full((len(students), len(steps)), np.nan)
    label = {}
    for r in results:
        i, j = students.index(r.student), steps.index(r.assignment)
        frac[i, j] = r.score / r.max_score if r.max_score else 0.0
        label[i, j] = f"{r.score:g}/{r.max_score:g}"
    fig, ax = plt.subplots(figsize=(1.0 * len(steps) + 2.5, 0.4 * len(students) + 1.6))
    im = ax.imshow(np.ma.masked_invalid(frac), cmap="RdYlGn", vmin=0, vmax=1, aspect="auto")
    ax.set_xticks(range(len(steps)), [a.split("_")[0] for a in steps])
    ax.set_yticks(range(len(students)), students)
    if len(students) * len(steps) <= 400:
        for (i, j), text in label.items():
            ax.text(j, i, text, ha="center", va="center", fontsize=7)
    ax.set(xlabel="step", title="score per student per step (share of the step's points)")
    fig.colorbar(im, ax=ax, fraction=0.03)
    fig.tight_layout()
    fig.savefig(out / OVERVIEW, dpi=100)
    plt.close(fig)
    return OVERVIEW


def _student_scores(a: str, rs: list[Result], out: Path, plt) -> str:
    """One step: each student's score, a bar to the step's maximum (green: every point this machine
    can give, the tests it failed all need a GPU; orange: some points; red: none; points awaiting
    manual grading hatched after it)."""
    rs = sorted(rs, key=lambda r: r.student)
    top = max((r.max_score for r in rs), default=0) or 1
    fig, ax = plt.subplots(figsize=(6, 0.3 * len(rs) + 1.2))
    names = [r.student for r in rs]

    def all_here(r: Result) -> bool:
        return r.score > 0 and all(r.messages.get(t, "").startswith("No GPU here") for t in r.failed
                                   if any(x["name"] == t and x.get("auto") for x in r.tests))

    colors = ["#55a868" if all_here(r) else "#dd8452" if r.score > 0 else "#c44e52" for r in rs]
    ax.barh(names, [r.score for r in rs], color=colors)
    ax.barh(names, [r.manual_pending for r in rs], left=[r.score for r in rs], color="none",
            edgecolor="#777", hatch="//", label="awaits manual grading")
    for i, r in enumerate(rs):
        ax.text(min(r.score + r.manual_pending, top) + top * 0.01, i, f"{r.score:g} / {r.max_score:g}", va="center",
                fontsize=8)
    ax.invert_yaxis()
    ax.set(xlim=(0, top * 1.25), xlabel="score", title=f"{a}: score per student")
    if any(r.manual_pending for r in rs):
        ax.legend(loc="upper right", fontsize=7)
    fig.tight_layout()
    name = f"{slug(a)}_students.png"
    fig.savefig(out / name, dpi=100)
    plt.close(fig)
    return name


def _plots(results: list[Result], out: Path) -> dict[str, list[str]]:
    """Draw the class plots: ``{"": [the overview]}`` and, for each assignment, ``{assignment: [png
    file names]}`` (each student's score, the score distribution, pass rates, perf)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files: dict[str, list[str]] = defaultdict(list)
    overview = _overview(results, out, plt)
    if overview:
        files[""].append(overview)
    by_a = defaultdict(list)
    for r in results:
        by_a[r.assignment].append(r)
    for a, rs in sorted(by_a.items()):
        files[a].append(_student_scores(a, rs, out, plt))
        top = max((r.max_score for r in rs), default=0) or 1
        fig, ax = plt.subplots(figsize=(6, 3))
        ax.hist([r.score for r in rs], bins=[x - 0.5 for x in range(int(top) + 2)], color="#4c72b0",
                edgecolor="white")
        ax.set(xlabel="score", ylabel="submissions", title=f"{a}: score distribution")
        fig.tight_layout()
        name = f"{slug(a)}_scores.png"
        fig.savefig(out / name, dpi=100)
        plt.close(fig)
        files[a].append(name)

        rates = _pass_rates(rs)
        if rates:
            fig, ax = plt.subplots(figsize=(6, 0.35 * len(rates) + 1))
            names = list(rates)
            ax.barh(names, [rates[n][0] / max(rates[n][1], 1) * 100 for n in names], color="#55a868")
            ax.invert_yaxis()
            ax.set(xlim=(0, 100), xlabel="% of graded submissions passing", title=f"{a}: pass rate per test")
            fig.tight_layout()
            name = f"{slug(a)}_pass_rates.png"
            fig.savefig(out / name, dpi=100)
            plt.close(fig)
            files[a].append(name)

        perf = [(r.student, p) for r in rs for p in r.perf
                if p.get("tflops_student", p.get("gbps_student")) is not None]
        if perf:
            key, unit = ("gbps", "GB/s of K and V") if "gbps_student" in perf[0][1] else ("tflops", "TFLOP/s")
            fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 0.35 * len(perf) + 1.5))
            labels = [f"{s} {p.get('config', '').split(' ')[0]}" for s, p in perf]
            ax1.barh(labels, [p[key + "_student"] for _, p in perf], color="#4c72b0", label="student")
            ax1.scatter([p.get(key + "_ref", 0) for _, p in perf], labels, color="k", marker="|", s=200,
                        label="reference", zorder=3)
            ax1.set(xlabel=unit, title="throughput")
            ax1.legend(loc="lower right", fontsize=8)
            ax1.invert_yaxis()
            ax2.barh(labels, [p.get("ratio", 0) for _, p in perf], color="#dd8452")
            for x, st in ((perf[0][1].get("min"), "--"), (perf[0][1].get("target"), "-")):
                if x:
                    ax2.axvline(x, color="k", linestyle=st, linewidth=1)
            ax2.set(xlabel="t_ref / t_student", title="ratio to the reference (min --, target -)")
            ax2.invert_yaxis()
            ax2.set_yticklabels([])
            fig.tight_layout()
            name = f"{slug(a)}_perf.png"
            fig.savefig(out / name, dpi=100)
            plt.close(fig)
            files[a].append(name)
    return files


def _pass_rates(rs: list[Result]) -> dict[str, tuple[int, int]]:
    """{test: (passed, graded)} over submissions that were actually graded."""
    rates: dict[str, list[int]] = {}
    for r in rs:
        if not r.status.startswith("graded"):
            continue
        for t in r.tests:
            if not t.get("auto") or not t.get("max_score"):
                continue
            c = rates.setdefault(t["name"], [0, 0])
            c[0] += t["score"] >= t["max_score"]
            c[1] += 1
    return {k: (v[0], v[1]) for k, v in rates.items()}


def _machines(results: list[Result]) -> list[dict]:
    seen, out = set(), []
    for r in results:
        for p in r.perf:
            env = p.get("env") or {}
            key = json.dumps(env, sort_keys=True)
            if env and key not in seen:
                seen.add(key)
                out.append(env)
    return out


#: What a student's page says of a test graded by hand (t["manual"], manual.py).
_BY_HAND = {
    manual.GRADED: "<span class='pass'>graded by hand</span>",
    manual.ADJUSTED: "<span class='pass'>points adjusted by hand</span>",
    manual.STALE: "<span class='fail'>changed since graded by hand: to be reviewed</span>",
    manual.PENDING: "<span class='muted'>awaits grading by hand</span>",
    manual.UNANSWERED: "<span class='fail'>not answered</span>",
}


def _feedback_rows(r: Result) -> str:
    rows = []
    for t in r.tests:
        name = t["name"]
        how = t.get("manual")
        points = f"{t['score']:g} / {t['max_score']:g}"
        if how in _BY_HAND:
            verdict, why = _BY_HAND[how], ""
            if how == manual.PENDING:
                points = f"- / {t['max_score']:g}"
        elif not t.get("auto"):
            verdict, why = "<span class='muted'>graded by hand</span>", ""
        elif t["score"] >= t["max_score"]:
            verdict, why = "<span class='pass'>passed</span>", ""
        else:
            verdict = "<span class='fail'>failed</span>"
            why = _feedback(r.messages.get(name, ""))
        if t.get("comment"):
            why += ("<br>" if why else "") + f"<span class='comment'>{_e(t['comment'])}</span>"
        rows.append(f"<tr><td>{_e(name)}</td><td>{points}</td><td>{verdict}</td><td>{why}</td></tr>")
    return "".join(rows)


SEED = re.compile(r"(seed\s*[=:(]?\s*)-?\d+", re.IGNORECASE)


def hide_seeds(text: str) -> str:
    """A grading seed is secret (a regrade draws the same inputs): never shown to a student."""
    return SEED.sub(r"\1(hidden)", text)


def _feedback(msg: str) -> str:
    """The error's name, the first line of its message and the check's "likely cause" line."""
    if not msg:
        return ""
    msg = hide_seeds(msg)
    ename, _, text = msg.partition(": ")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    first = lines[0] if lines else ""
    first = first if len(first) <= 300 else first[:297] + "..."
    cause = next((ln for ln in lines if ln.startswith("likely cause:")), "")
    out = f"<code>{_e(ename)}</code> {_e(first)}"
    if cause and cause != first:
        out += f"<br><b>{_e(cause)}</b>"
    return out


def _flag_table(rows: list[tuple[str | None, dict]]) -> str:
    """The static scan's and the judge's findings, one row each: (student or None, flag)."""
    who = any(student is not None for student, _ in rows)
    body = "".join(
        "<tr>" + (f"<td>{_e(student)}</td>" if who else "")
        + f"<td class='{'fail' if f.get('severity') == 'tamper' else 'muted'}'>{_e(f.get('severity', ''))}</td>"
        f"<td>{_e(f.get('where', ''))}</td><td>{_e(f.get('rule', ''))}</td>"
        f"<td><code>{_e(str(f.get('line', '')).strip()[:200])}</code></td></tr>" for student, f in rows)
    return (f"<table><tr>{'<th>student</th>' if who else ''}<th>severity</th><th>where</th><th>rule</th>"
            f"<th>line</th></tr>{body}</table><p class='muted'>tamper: the judged tests score 0 until an "
            "instructor clears the flag (<code>autograde --force --trust STUDENT</code>); review: shown, "
            "no points change.</p>")


def _student_sections(r: Result) -> list[str]:
    """One assignment of a student's feedback: score, status, each test, perf, flags."""
    pending = f" ({r.manual_pending:g} point(s) await grading by hand)" if r.manual_pending else ""
    parts = [f"<h2>{_e(r.assignment)}: {r.score:g} / {r.max_score:g}{pending}</h2>"
             f"<p>status: {_e(r.status)}</p>"]
    if r.tests:
        parts.append("<table><tr><th>test</th><th>points</th><th>result</th><th>feedback</th></tr>"
                     + _feedback_rows(r) + "</table>")
    if r.cell_comments:
        parts.append("<h3>Comments on your code</h3><table><tr><th>cell</th><th>comment</th></tr>" + "".join(
            f"<tr><td>{_e(k)}</td><td><span class='comment'>{_e(v)}</span></td></tr>"
            for k, v in r.cell_comments.items()) + "</table>")
    for p in r.perf:
        parts.append(f"<p>performance: {_e(p.get('summary') or p.get('flag') or p.get('status', ''))}</p>")
    if r.flags:
        parts.append("<h3>Flagged for the instructor's review</h3>" + _flag_table([(None, f) for f in r.flags]))
    return parts


_FOOTER = ("<p class='muted'>Feedback names each failed test and the check's likely cause; "
           "the hidden tests themselves stay hidden.</p>")


def write_feedback_page(r: Result, path: Path) -> None:
    """One (student, assignment) page, ready to return to the student (``export``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_page(f"Feedback for {r.student}: {r.assignment}", "".join(_student_sections(r)) + _FOOTER),
                    encoding="utf-8")


def write_student_page(student: str, rs: list[Result], path: Path) -> None:
    parts = []
    for r in rs:
        parts += _student_sections(r)
    parts.append(_FOOTER)
    path.write_text(_page(f"Feedback for {student}", "".join(parts)), encoding="utf-8")


def write_report(results: list[Result], out: Path, machine: dict | None = None) -> Path:
    """Write the class page, one page per student and the plots under ``out``; returns index.html."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "students").mkdir(exist_ok=True)
    for old in out.glob("*.png"):
        old.unlink()
    files = _plots(results, out)
    body = [f"<p>{len(results)} submission(s), written {time.strftime('%Y-%m-%d %H:%M')}. "
            "Grades CSV: <code>grades.csv</code> in the workspace.</p>"]
    machine = machine or _grading_machine()
    body.append("<h2>Grading machine</h2><table>" + "".join(
        f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in machine.items()) + "</table>")
    if files.get(""):
        body.append("<h2>Scores per step</h2>" + "".join(f"<img src='{_e(f)}' alt='{_e(f)}'>" for f in files[""]))
    perf_envs = _machines(results)
    if perf_envs:
        body.append("<h2>Performance measured on</h2><table>" + "".join(
            "<tr>" + "".join(f"<td>{_e(k)}: {_e(v)}</td>" for k, v in env.items()) + "</tr>"
            for env in perf_envs) + "</table>")
    by_a = defaultdict(list)
    for r in results:
        by_a[r.assignment].append(r)
    for a, rs in sorted(by_a.items()):
        scores = [r.score for r in rs]
        pending = sum(bool(r.manual_pending) for r in rs)
        stale = sum(bool(manual.stale_tests(r)) for r in rs)
        body.append(f"<h2>{_e(a)}</h2><p>mean {sum(scores) / len(scores):.2f} of "
                    f"{max(r.max_score for r in rs):g}; {sum(r.status.startswith('graded') for r in rs)}"
                    f" of {len(rs)} graded"
                    + (f"; {pending} await grading by hand" if pending else "")
                    + (f"; {stale} with an answer changed since graded by hand" if stale else "")
                    + "</p>")
        body += [f"<img src='{_e(f)}' alt='{_e(f)}'>" for f in files.get(a, [])]
        rates = _pass_rates(rs)
        if rates:
            body.append("<table><tr><th>test</th><th>passed</th></tr>" + "".join(
                f"<tr><td>{_e(n)}</td><td>{p} / {g}</td></tr>" for n, (p, g) in rates.items()) + "</table>")
        perf = [(r.student, p) for r in rs for p in r.perf]
        if perf:
            unit = "GB/s of K/V" if any("gbps_student" in p for _, p in perf) else "TFLOP/s"
            key = "gbps" if unit != "TFLOP/s" else "tflops"
            body.append(f"<table><tr><th>student</th><th>config</th><th>{unit}</th><th>reference</th>"
                        "<th>ratio</th><th>points</th><th>note</th></tr>" + "".join(
                            f"<tr><td>{_e(s)}</td><td>{_e(p.get('config', ''))}</td>"
                            f"<td>{_e(_num(p.get(key + '_student')))}</td>"
                            f"<td>{_e(_num(p.get(key + '_ref')))} ({_e(p.get('backend', ''))})</td>"
                            f"<td>{_e(_num(p.get('ratio'), 2))}</td><td>{_e(p.get('points', ''))}</td>"
                            f"<td>{_e(p.get('flag') or p.get('status', ''))}</td></tr>" for s, p in perf)
                        + "</table>")
        flagged = [(r.student, f) for r in rs for f in r.flags]
        if flagged:
            body.append(f"<h3>Flagged for review ({len({s for s, _ in flagged})} submission(s))</h3>"
                        + _flag_table(flagged))
        body.append("<table><tr><th>student</th><th>score</th><th>status</th><th>failed tests</th></tr>")
        for r in rs:
            body.append(f"<tr><td><a href='students/{_e(slug(r.student))}.html'>{_e(r.student)}</a></td>"
                        f"<td>{r.score:g} / {r.max_score:g}</td><td>{_e(r.status)}</td>"
                        f"<td>{_e(', '.join(r.failed) or '-')}</td></tr>")
        body.append("</table>")
    by_s = defaultdict(list)
    for r in results:
        by_s[r.student].append(r)
    for s, rs in by_s.items():
        write_student_page(s, rs, out / "students" / f"{slug(s)}.html")
    index = out / "index.html"
    index.write_text(_page("Autograding report", "".join(body)), encoding="utf-8")
    return index


def _num(x, digits: int = 0) -> str:
    return "" if x is None else f"{x:.{digits}f}"


def _grading_machine() -> dict:
    from .perf import environment
    return environment()


# ----------------------------------------------------------------------------- text and CSV
def _headline(msg: str) -> str:
    """One line of a failure: the check's 'likely cause' when it gave one, else the first line."""
    lines = [ln.strip() for ln in msg.splitlines() if ln.strip()]
    cause = [ln for ln in lines if ln.startswith("likely cause:")]
    line = cause[-1] if cause else (lines[0] if lines else "")
    return line if len(line) <= 200 else line[:197] + "..."


# ----------------------------------------------------------------------------- reports
def write_csv(results: list[Result], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["student", "assignment", "score", "max_score", "manual_pending", "status",
                    "failed_tests", "seconds", "flags", "manual_points", "manual_stale", "comments"])
        for r in results:
            w.writerow([r.student, r.assignment, f"{r.score:g}", f"{r.max_score:g}",
                        f"{r.manual_pending:g}", r.status, " ".join(r.failed), f"{r.seconds:.1f}",
                        " | ".join(f"{f['severity']}: {f['where']}: {f['rule']}" for f in r.flags),
                        f"{manual.manual_points(r):g}", " ".join(manual.stale_tests(r)),
                        " | ".join(f"{k}: {' '.join(v.split())}" for k, v in manual.comments(r).items())])


def table(results: list[Result]) -> str:
    head = ("student", "assignment", "score", "status", "failed tests")
    rows = [(r.student, r.assignment, f"{r.score:g} / {r.max_score:g}",
             r.status + (f" ({r.manual_pending:g} pts await manual grading)" if r.manual_pending else ""),
             ", ".join(r.failed) or "-") for r in results]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths[:-1]) + "  {}"
    lines = [fmt.format(*head), fmt.format(*("-" * w for w in widths))]
    lines += [fmt.format(*row) for row in rows]
    return "\n".join(lines)


def summary(results: list[Result], seconds: float | None = None) -> str:
    graded = [r for r in results if r.status.startswith("graded")]
    other = [r for r in results if not r.status.startswith("graded")]
    reused = sum(r.reused for r in results)
    line = (f"{len(results)} submission(s): {len(graded)} graded, {len(other)} scored 0 without "
            f"grading (see status)" + (f"; {reused} unchanged since the last run, reused" if reused else ""))
    if seconds is not None:
        line += f"; {seconds:.0f} s"
    return line


def print_report(results: list[Result], csv_path: Path, show_messages: bool = True,
            workspace: Path | None = None, seconds: float | None = None, html: bool = True) -> list[Result]:
    """The grade table, the CSV and (``html``) the HTML report; with a ``workspace``, every output
    carries its gradebook's manual grades and comments. Returns the results as reported."""
    if workspace is not None:
        results = manual.with_manual_grades(workspace, results)
    write_csv(results, csv_path)
    print()
    print(table(results))
    if show_messages:
        for r in results:
            for gid, msg in r.messages.items():
                print(f"  {r.student}/{r.assignment} {gid}: {_headline(msg)}")
    print(f"\n{summary(results, seconds)}")
    print(f"grades written to {csv_path}")
    if workspace is not None and html:
        index = write_report(results, workspace / "report")
        print(f"report written to {index}")
    return results


