"""HTML reports: an executed notebook as one self-contained page, and the suite's index.

A notebook page comes from nbconvert's HTML exporter (lab template): images are embedded as data
URIs, the CDN scripts (require.js, MathJax: the notebooks use neither) are dropped so the page
opens offline, stderr (progress bars, warnings) is left out, and code cells are hidden behind a
"show code" button.
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

from gdn_lab.experiments.common import short_reason
from gdn_lab.report.io import atomic_write_text
from gdn_lab.report.provenance import describe as describe_code

_REMOTE_SCRIPT = re.compile(r"<script[^>]*\ssrc=\"https?://[^\"]*\"[^>]*>\s*</script>\s*", re.IGNORECASE)
_MATHJAX_CONFIG = re.compile(r"<!-- Load mathjax -->.*?<!-- End of mathjax configuration -->\s*", re.DOTALL)

TOGGLE = """
<style>
  body.gdn-hide-code .jp-CodeCell .jp-Cell-inputWrapper { display: none; }
  #gdn-code-toggle { position: fixed; top: 8px; right: 12px; z-index: 100; padding: 4px 10px;
    font: 13px sans-serif; border: 1px solid #999; border-radius: 4px; background: #fff; cursor: pointer; }
</style>
<button id="gdn-code-toggle" type="button"
  onclick="var h=document.body.classList.toggle('gdn-hide-code');this.textContent=h?'show code':'hide code';">show code</button>
"""


REPORT_CSS = """
<style>
  .gdn-banner { font: 14px/1.45 -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 12px 16px 4px;
    padding: 10px 14px; border-left: 6px solid #57606a; background: #f6f8fa; }
  .gdn-banner.ok { border-color: #1a7f37; } .gdn-banner.failed, .gdn-banner.interrupted { border-color: #cf222e; }
  .gdn-banner .gdn-headline { font-size: 16px; font-weight: 600; }
  .gdn-banner .gdn-meta { color: #57606a; font-size: 12px; margin-top: 4px; }
  .jp-RenderedHTMLCommon td, .jp-RenderedHTMLCommon th { white-space: normal; max-width: 48em; overflow-wrap: anywhere; }
</style>
"""


def report_banner(result: dict[str, Any]) -> str:
    """The box on top of a notebook's report: its status and headline, error rows, warnings, run."""
    esc = html.escape
    status = result.get("status") or "not run"
    headline = result.get("headline") or (short_reason(result.get("error")) if result.get("error") else "no headline")
    meta = [f"status: {status}"]
    if result.get("error_rows"):
        meta.append(f"{result['error_rows']} error rows in its tables (status = error; full text in the CSV)")
    captured = (result.get("warnings") or {}).get("captured")
    if captured:
        names = ", ".join(w["name"] for w in result["warnings"].get("warnings", []))
        meta.append(f"{captured} known warnings captured, not shown ({names})")
    if result.get("started"):
        meta.append(
            f"started {result['started']}" + (f", {result['duration_s']:.1f} s" if result.get("duration_s") else "")
        )
    return (
        f'<div class="gdn-banner {esc(status)}"><div class="gdn-headline">{esc(headline)}</div>'
        f'<div class="gdn-meta">{esc(" · ".join(meta))}</div></div>'
    )


def notebook_to_html(ipynb: str | Path, out: str | Path, banner: dict[str, Any] | None = None) -> Path:
    """Render an executed notebook to one self-contained HTML page (code hidden, a toggle shows it).

    Args:
        ipynb: the executed notebook.
        out: the .html file to write (atomically).
        banner: the notebook's result (`runner.NotebookResult` as a dict): its headline and status
            go in a box at the top of the page.

    Returns:
        The path written.
    """
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(str(ipynb), as_version=4)
    # Progress bars and warnings go to stderr: useful live, noise in a shared report (the executed
    # notebook keeps them).
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = [o for o in cell.outputs if not (o.output_type == "stream" and o.name == "stderr")]
    exporter = HTMLExporter(template_name="lab", embed_images=True)
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": Path(ipynb).stem}})
    body = _MATHJAX_CONFIG.sub("", _REMOTE_SCRIPT.sub("", body))
    body = body.replace("</head>", REPORT_CSS + "</head>", 1)
    body = re.sub(r"<body([^>]*)class=\"", r'<body\1class="gdn-hide-code ', body, count=1)
    if banner is not None:
        body = re.sub(r"(<body[^>]*>)", lambda m: m.group(1) + report_banner(banner), body, count=1)
    body = body.replace("</body>", TOGGLE + "</body>", 1)
    return atomic_write_text(out, body)


STATUS_COLORS = {
    "ok": "#1a7f37",
    "failed": "#cf222e",
    "interrupted": "#9a6700",
    "incomplete": "#cf222e",
    "running": "#0969da",
    "not run": "#57606a",
}

INDEX_CSS = """
body { font: 14px/1.45 -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 2em auto; max-width: 1100px; color: #1f2328; }
table { border-collapse: collapse; width: 100%; }
th, td { border-bottom: 1px solid #d0d7de; padding: 6px 8px; text-align: left; vertical-align: top; overflow-wrap: anywhere; }
th { background: #f6f8fa; }
.status { font-weight: 600; }
.meta td { border: none; padding: 2px 8px; }
.verdict { font-size: 17px; font-weight: 600; padding: 10px 14px; border-left: 6px solid; margin: 1em 0; }
.verdict.ok { border-color: #1a7f37; background: #dafbe1; }
.verdict.warn { border-color: #9a6700; background: #fff8c5; }
.verdict.fail { border-color: #cf222e; background: #ffebe9; }
.other-run { color: #9a6700; font-size: 12px; }
.note { color: #57606a; font-size: 12px; }
details { font-size: 12px; } summary { cursor: pointer; color: #cf222e; }
pre { white-space: pre-wrap; font-size: 12px; background: #fff8f8; padding: 6px; margin: 4px 0 0; }
"""


def _link(href: str | None, text: str) -> str:
    return f'<a href="{html.escape(href)}">{html.escape(text)}</a>' if href else ""


def verdict(summary: dict[str, Any]) -> tuple[str, str]:
    """(level "ok" | "warn" | "fail", one line): the whole run at a glance, for the top of the index."""
    nbs = summary.get("notebooks", [])
    run = summary.get("run") or {}
    state = run.get("state") or ("complete" if summary.get("finished") else "running")
    done = [nb for nb in nbs if nb.get("status") in ("ok", "failed")]
    bad = [nb["name"] for nb in nbs if nb.get("status") != "ok"]
    errors = {nb["name"]: nb.get("error_rows") for nb in nbs if nb.get("error_rows")}
    runs = {nb.get("run_id") for nb in nbs if nb.get("run_id")}
    codes = {nb.get("source_version") for nb in nbs if nb.get("source_version")}
    parts: list[str] = []
    if state == "running":
        level = "fail"
        parts.append(
            f"INCOMPLETE: this run started {run.get('started')} and has not finished ({len(done)} of {len(nbs)} notebooks "
            f"done). Either it is still running (pid {run.get('pid')} on {run.get('host')}) or it was killed; "
            "a partial notebook is linked as partial"
        )
    elif state == "interrupted":
        level = "fail"
        parts.append(f"INTERRUPTED at {run.get('finished')}: {len(done)} of {len(nbs)} notebooks done")
    elif bad:
        level = "fail"
        parts.append(f"{len(bad)} of {len(nbs)} notebooks are not ok: {', '.join(bad)}")
    else:
        level = "ok"
        parts.append(f"All {len(nbs)} notebooks ran" if len(nbs) != 1 else "The notebook ran")
    if errors:
        level = "fail" if level == "fail" else "warn"
        parts.append("error rows in " + ", ".join(f"{n} ({c})" for n, c in errors.items()))
    if len(runs) > 1 or len(codes) > 1:
        level = "fail" if level == "fail" else "warn"
        what = [f"{len(runs)} runs"] if len(runs) > 1 else []
        what += [f"{len(codes)} code versions"] if len(codes) > 1 else []
        parts.append(f"the notebooks come from {' and '.join(what)} (marked below)")
    return level, "; ".join(parts)


def index_html(summary: dict[str, Any]) -> str:
    """The suite's index page from its summary (see `runner.Summary.to_dict`)."""
    esc = html.escape
    fp = summary.get("fingerprint", {})
    run = summary.get("run") or {"started": summary.get("started"), "finished": summary.get("finished")}
    runs = summary.get("runs") or {}
    level, line = verdict(summary)
    meta = [
        ("preset", summary.get("preset")),
        (
            "this run",
            f"started {run.get('started')}, "
            + (f"{run.get('state')} {run.get('finished')}" if run.get("finished") else "not finished"),
        ),
        ("device", f"{fp.get('device')} ({fp.get('arch')}, {fp.get('platform')})"),
        ("versions", ", ".join(f"{k} {fp.get(k)}" for k in ("torch", "triton", "fla", "aiter") if fp.get(k))),
        ("code", describe_code(run.get("code"))),
        ("overrides", ", ".join(f"{k}={v}" for k, v in (summary.get("overrides") or {}).items()) or "none"),
    ]
    if len(runs) > 1:
        meta.append(
            ("runs", "; ".join(f"{rid}: started {r.get('started')}, {r.get('state', '')}, code {describe_code(r.get('code'))}"
                               for rid, r in runs.items()))
        )  # fmt: skip
    if summary.get("archive_error"):
        meta.append(("archive", f"FAILED: {summary['archive_error']}"))
    rows = []
    this = run.get("id")
    for nb in summary.get("notebooks", []):
        status = nb.get("status", "not run")
        color = STATUS_COLORS.get(status, "#57606a")
        files = nb.get("files", {})
        partial = " (partial)" if files.get("partial") else ""
        links = " · ".join(
            x
            for x in [_link(files.get("html"), "report"), _link(files.get("ipynb"), "notebook" + partial)]
            + [_link(t, Path(t).name) for t in files.get("tables", [])]
            + [_link(files.get("kernel_log"), "kernel log")]
            if x
        )
        details = []
        if nb.get("run_id") and this and nb["run_id"] != this:
            other = runs.get(nb["run_id"], {})
            details.append(f'<div class="other-run">from another run: started {esc(str(other.get("started")))}</div>')
        current = (run.get("code") or {}).get("source")
        if nb.get("source_version") and current and nb["source_version"] != current:
            details.append(
                f'<div class="other-run">other code: source {esc(nb["source_version"])} (this run: {esc(current)})</div>'
            )
        if nb.get("note"):
            details.append(f'<div class="note">{esc(nb["note"])}</div>')
        if nb.get("error_rows"):
            details.append(f'<div class="other-run">{nb["error_rows"]} error rows in its tables</div>')
        if (nb.get("warnings") or {}).get("captured"):
            details.append(f'<div class="note">{nb["warnings"]["captured"]} known warnings captured (not shown)</div>')
        if nb.get("error"):
            details.append(
                f"<details><summary>{esc(short_reason(nb['error']))}</summary><pre>{esc(nb['error'])}</pre></details>"
            )
        duration = f"{nb['duration_s']:.1f} s" if nb.get("duration_s") is not None else ""
        rows.append(
            f"<tr><td>{esc(nb['name'])}</td>"
            f'<td class="status" style="color:{color}">{esc(status)}</td>'
            f"<td>{duration}</td><td>{esc(nb.get('headline') or '')}{''.join(details)}</td><td>{links}</td></tr>"
        )
    meta_rows = "".join(f"<tr><td><b>{esc(k)}</b></td><td>{esc(str(v))}</td></tr>" for k, v in meta)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>gdn_lab: {esc(str(summary.get("preset")))}</title>
<style>{INDEX_CSS}</style></head>
<body>
<h1>gdn_lab suite: {esc(str(summary.get("preset")))}</h1>
<div class="verdict {level}">{esc(line)}</div>
<table class="meta">{meta_rows}</table>
<h2>Notebooks</h2>
<table>
<tr><th>notebook</th><th>status</th><th>duration</th><th>headline</th><th>files</th></tr>
{"".join(rows)}
</table>
</body></html>
"""
