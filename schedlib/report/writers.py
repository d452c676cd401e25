"""Writing a comparison: CSV, Markdown, and a self-contained HTML page with its plots embedded."""

from __future__ import annotations

import base64
import html
import io
import json
import math
import os
import secrets
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from schedlib.errors import SchedlibError
from schedlib.report.compare import COLUMNS

# The report tables show every column of the CSV (issue 7 lists them all as what a comparison reports), named
# as in the CSV so that a reader can move between the files; config as compact JSON keeps rows one line.
SUMMARY = list(COLUMNS)


def _cell(v: Any) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "n/a"
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    if isinstance(v, dict):
        return json.dumps(v, separators=(",", ":"))
    return "" if v is None else str(v)


def _md_cell(column: str, v: Any) -> str:
    """One Markdown table cell: on one line (a newline would end the row), ``|`` escaped (it would split the
    cell), a config as code (its JSON is not prose: no emphasis from ``*`` or ``_``), and elsewhere ``$``
    escaped (GitHub renders ``$M,N=$`` as math; a backslash is literal inside code, so not there)."""
    text = " ".join(_cell(v).splitlines())
    if column == "config" and isinstance(v, (dict, str)) and text:
        fence = "``" if "`" in text else "`"
        text = f"{fence}{text}{fence}" if fence == "`" else f"{fence} {text} {fence}"
    else:
        text = text.replace("$", "\\$")
    return text.replace("|", "\\|")


def markdown_table(df: pd.DataFrame, columns: list[str] | None = None) -> str:
    cols = [c for c in (columns or list(df.columns)) if c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, row in df.iterrows():
        lines.append("| " + " | ".join(_md_cell(c, row[c]) for c in cols) + " |")
    return "\n".join(lines)


def _html_cell(column: str, v: Any) -> str:
    text = html.escape(_cell(v))
    return f"<td><code>{text}</code></td>" if column == "config" and isinstance(v, (dict, str)) else f"<td>{text}</td>"


def _drawn(text: Any) -> str:
    """A user's string as matplotlib should draw it: literally.  Two ``$`` make mathtext of what lies between
    (``matmul:M=$M,N=$N`` lost its dollars and turned italic), so each is escaped; a legend leaves out labels
    that start with ``_``, so those get a leading space."""
    out = str(text).replace("$", r"\$")
    return " " + out if out.startswith("_") else out


def _figure_png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode()


def roofline_bars(df: pd.DataFrame) -> list[tuple[str, str]]:
    """One bar chart per workload: % of roofline by method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = []
    for workload, part in df.groupby("workload", sort=False):
        fig, ax = plt.subplots(figsize=(5, 2.4))
        values = part["pct_roofline"].fillna(0.0)
        ax.bar([_drawn(m) for m in part["method"]], values, color="#4878a8")
        ax.set_ylabel("% of roofline")
        ax.set_title(_drawn(workload), fontsize=9)
        ax.tick_params(axis="x", labelsize=7)
        out.append((str(workload), _figure_png(fig)))
        plt.close(fig)
    return out


def convergence_plot(histories: dict[str, list[float]]) -> str | None:
    """Best time so far against trial number, one line per workload."""
    if not histories:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3))
    for name, hist in histories.items():
        ax.plot(range(1, len(hist) + 1), hist, label=_drawn(name))
    ax.set_xlabel("trial")
    ax.set_ylabel("best time so far (us)")
    ax.set_yscale("log")
    ax.legend(fontsize=6)
    png = _figure_png(fig)
    plt.close(fig)
    return png


def flat_configs(df: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``df`` whose ``config`` column is JSON text, as the CSV files keep it (a dict's repr is
    Python, not data)."""
    flat = df.copy()
    if "config" in flat.columns:
        flat["config"] = flat["config"].map(lambda c: json.dumps(c) if isinstance(c, dict) else c)
    return flat


REPORT_FILES = ("report.csv", "report.md", "report.html")


def prepare_out_dir(out_dir: str | Path, files: Iterable[str] = ()) -> Path:
    """Create ``out_dir`` and prove it writable, and that each of ``files`` can be written there (absent, or a
    writable file); called before long work, so a bad ``--out`` fails first rather than after the work, with
    some of the report already overwritten."""
    if isinstance(out_dir, str) and not out_dir.strip():  # Path("") is ".": the report would land in the cwd
        raise SchedlibError(f"the report folder {out_dir!r} is empty: give a folder name ('.' for the current "
                            f"folder)")
    out = Path(out_dir)
    if out.is_symlink() and not out.exists():  # mkdir would say "File exists" of a name that leads nowhere
        raise SchedlibError(f"cannot write the report to {out}: it is a symbolic link to {os.readlink(out)}, "
                            "which does not exist; create that folder or choose another")
    if out.exists() and not out.is_dir():  # mkdir would say "File exists", which reads as no problem
        raise SchedlibError(f"cannot write the report to {out}: it is a file, not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise SchedlibError(f"cannot write the report to {out}: {exc.strerror or exc}") from None
    for name in files:
        _check_writable(out / name)
    return out


def _check_writable(path: Path) -> None:
    """Refuse a report file that could not be written over: a folder or other non-file in its place, or a file
    that cannot be opened for writing (opened to append, so that nothing of it is lost here)."""
    if path.exists() and not path.is_file():
        what = "a folder" if path.is_dir() else "not a plain file"
        raise SchedlibError(f"cannot write the report to {path}: it is {what}; move it or choose another folder")
    if path.exists():
        try:
            with path.open("a"):
                pass
        except OSError as exc:
            raise SchedlibError(f"cannot write the report to {path}: {exc.strerror or exc}") from None


# 17 columns: small type keeps a row on one line of a laptop screen; a config wraps inside its own cell.
STYLE = ("<style>body{font-family:sans-serif} table{border-collapse:collapse;font-size:12px} "
         "th,td{padding:2px 5px;vertical-align:top} td code{font-size:11px;white-space:normal;"
         "overflow-wrap:anywhere}</style>")


def write_report(df: pd.DataFrame, out_dir: str | Path, *, histories: dict[str, list[float]] | None = None,
                 title: str = "schedlib comparison", extra: Mapping[str, str] | None = None) -> dict[str, Path]:
    """Write ``report.csv``, ``report.md`` and ``report.html`` under ``out_dir``; returns their paths.
    ``histories`` (workload -> best-so-far time per trial) draws the search's convergence; by default the
    ones ``compare`` keeps in ``df.attrs["histories"]``.  ``extra`` (file name -> text) is written with them
    (the demo's ``verification.csv``).  Every file is rendered first and then renamed into place, so a run
    stopped meanwhile (Ctrl-C during the plots, a full disk) leaves the previous report whole rather than
    a new CSV beside an old page, or a file cut short."""
    if not isinstance(df, pd.DataFrame) or "config" not in df.columns:
        raise TypeError(f"write_report needs the DataFrame sl.report.compare returns, got {type(df).__name__}"
                        + (f" with columns {list(df.columns)}" if isinstance(df, pd.DataFrame) else ""))
    out = prepare_out_dir(out_dir, (*REPORT_FILES, *(extra or {})))  # each checked before any is replaced
    source = "measured on the GPU" if df.attrs.get("measured") else "estimated by the carver model (no GPU)"
    csv_path, md_path, html_path = out / "report.csv", out / "report.md", out / "report.html"
    csv_text = flat_configs(df).to_csv(index=False)
    md = [f"# {title}", "", f"Target: {df.attrs.get('target')}; times {source}; roofline from "
          f"{df.attrs.get('roofline')}.", "", markdown_table(df, SUMMARY), ""]
    bars = roofline_bars(df)
    conv = convergence_plot(histories if histories is not None else df.attrs.get("histories") or {})
    parts = [f"<h1>{html.escape(title)}</h1>", f"<p>Target {html.escape(str(df.attrs.get('target')))}; times "
             f"{html.escape(source)}; roofline from {html.escape(str(df.attrs.get('roofline')))}.</p>",
             "<table border='1' cellspacing='0' cellpadding='3'>",
             "<tr>" + "".join(f"<th>{c}</th>" for c in SUMMARY) + "</tr>"]
    for _, row in df.iterrows():
        parts.append("<tr>" + "".join(_html_cell(c, row[c]) for c in SUMMARY) + "</tr>")
    parts.append("</table><h2>% of roofline by method</h2>")
    for name, png in bars:
        parts.append(f"<figure><img alt='{html.escape(name)}' src='data:image/png;base64,{png}'/></figure>")
    if conv:
        parts.append(f"<h2>Search convergence</h2><img alt='convergence' src='data:image/png;base64,{conv}'/>")
    page = ("<!doctype html><html><head><meta charset='utf-8'><title>" + html.escape(title) + "</title>" + STYLE
            + "</head><body>" + "\n".join(parts) + "</body></html>")
    texts = {csv_path: csv_text, md_path: "\n".join(md), html_path: page}
    publish({**texts, **{out / name: text for name, text in (extra or {}).items()}})
    return {"csv": csv_path, "markdown": md_path, "html": html_path}


def publish(files: Mapping[Path, str]) -> None:
    """Write each text to a temporary file beside its path, then rename them all into place: a reader (or a
    run stopped meanwhile) sees each file old or new and whole, and the renames leave a window of
    microseconds, not the seconds the plots take.  The temporary files are gone afterwards, whatever
    happens.  A path that is a symbolic link has its target replaced, as writing through it did."""
    temps: dict[Path, Path] = {}
    try:
        for path, text in files.items():
            final = path.resolve() if path.is_symlink() else path
            tmp = final.with_name(f".{final.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
            temps[final] = tmp
            # O_EXCL: never write through a name someone placed there; 0o666 under the umask, as open() does
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
                fh.write(text)
        for final, tmp in temps.items():
            os.replace(tmp, final)
    finally:
        for tmp in temps.values():
            tmp.unlink(missing_ok=True)
