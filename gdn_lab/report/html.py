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

from gdn_lab.report.io import atomic_write_text

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


def notebook_to_html(ipynb: str | Path, out: str | Path) -> Path:
    """Render an executed notebook to one self-contained HTML page (code hidden, a toggle shows it).

    Args:
        ipynb: the executed notebook.
        out: the .html file to write (atomically).

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
    body = re.sub(r"<body([^>]*)class=\"", r'<body\1class="gdn-hide-code ', body, count=1)
    body = body.replace("</body>", TOGGLE + "</body>", 1)
    return atomic_write_text(out, body)


STATUS_COLORS = {"ok": "#1a7f37", "failed": "#cf222e", "interrupted": "#9a6700", "not run": "#57606a"}

INDEX_CSS = """
body { font: 14px/1.45 -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 2em auto; max-width: 1100px; color: #1f2328; }
table { border-collapse: collapse; width: 100%; }
th, td { border-bottom: 1px solid #d0d7de; padding: 6px 8px; text-align: left; vertical-align: top; }
th { background: #f6f8fa; }
.status { font-weight: 600; }
.meta td { border: none; padding: 2px 8px; }
pre { white-space: pre-wrap; font-size: 12px; background: #fff8f8; padding: 6px; margin: 4px 0 0; }
"""


def _link(href: str | None, text: str) -> str:
    return f'<a href="{html.escape(href)}">{html.escape(text)}</a>' if href else ""


def index_html(summary: dict[str, Any]) -> str:
    """The suite's index page from its summary (see `runner.Summary.to_dict`)."""
    esc = html.escape
    fp = summary.get("fingerprint", {})
    meta = [
        ("preset", summary.get("preset")),
        ("started", summary.get("started")),
        ("finished", summary.get("finished") or "running"),
        ("device", f"{fp.get('device')} ({fp.get('arch')}, {fp.get('platform')})"),
        ("versions", ", ".join(f"{k} {fp.get(k)}" for k in ("torch", "triton", "fla", "aiter") if fp.get(k))),
        ("overrides", ", ".join(f"{k}={v}" for k, v in (summary.get("overrides") or {}).items()) or "none"),
    ]
    rows = []
    for nb in summary.get("notebooks", []):
        status = nb.get("status", "not run")
        color = STATUS_COLORS.get(status, "#57606a")
        files = nb.get("files", {})
        links = " · ".join(
            x
            for x in [_link(files.get("html"), "report"), _link(files.get("ipynb"), "notebook")]
            + [_link(t, Path(t).name) for t in files.get("tables", [])]
            if x
        )
        error = f"<pre>{esc(nb['error'])}</pre>" if nb.get("error") else ""
        duration = f"{nb['duration_s']:.1f} s" if nb.get("duration_s") is not None else ""
        rows.append(
            f"<tr><td>{esc(nb['name'])}</td>"
            f'<td class="status" style="color:{color}">{esc(status)}</td>'
            f"<td>{duration}</td><td>{esc(nb.get('headline') or '')}{error}</td><td>{links}</td></tr>"
        )
    meta_rows = "".join(f"<tr><td><b>{esc(k)}</b></td><td>{esc(str(v))}</td></tr>" for k, v in meta)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>gdn_lab: {esc(str(summary.get("preset")))}</title>
<style>{INDEX_CSS}</style></head>
<body>
<h1>gdn_lab suite: {esc(str(summary.get("preset")))}</h1>
<table class="meta">{meta_rows}</table>
<h2>Notebooks</h2>
<table>
<tr><th>notebook</th><th>status</th><th>duration</th><th>headline</th><th>files</th></tr>
{"".join(rows)}
</table>
</body></html>
"""
