"""``report.html``: the report as one self-contained page a person opens in a browser (no file beside it needed).

    page(title, intro, defs, sections) -> str

The definitions the captions cite come once, at the top; then a section per question (``layout.SECTIONS``, only
those with data), each with its tables in the compact view (``compact.py``: blocks by model pair, task and
settings; every column is in the table's CSV) and its figures, embedded as base64 PNG. Tables scroll sideways on a
narrow window and sort by a click on a header (numbers by their value, '–' last), with a few lines of script
written here; the page loads nothing from the network.
"""
from __future__ import annotations

import base64
import struct
from html import escape
from pathlib import Path

from mars_bench.report.compact import view
from mars_bench.report.definitions import strip_definitions
from mars_bench.report.writer import Table

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;margin:0 auto;max-width:1400px;padding:0 1.5em 3em;
color:#1b1f24}
h1{margin:.8em 0 .2em}h2{border-bottom:2px solid #d0d7de;padding-bottom:.2em;margin-top:2em}
nav a{margin-right:1em}.question{color:#57606a;font-style:italic}
.defs{background:#f6f8fa;border:1px solid #d0d7de;border-radius:6px;padding:.5em 1em}.defs li{margin:.2em 0}
.scroll{overflow-x:auto;margin:.4em 0 1em}
table{border-collapse:collapse;font-size:13px}th,td{border:1px solid #d0d7de;padding:3px 7px;vertical-align:top}
th{background:#f6f8fa;cursor:pointer;position:sticky;top:0;white-space:nowrap}th.sorted-asc::after{content:' ▲'}
th.sorted-desc::after{content:' ▼'}td.num{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}
tr:nth-child(even) td{background:#fbfcfd}.context{margin:.8em 0 .2em;color:#24292f}.context b{font-weight:600}
.caption{margin:.3em 0}.notes{font-size:12px;color:#57606a}.notes li{margin:.1em 0}
.figures{display:flex;flex-wrap:wrap;gap:1em;align-items:flex-start}
figure{margin:.5em 0 1.5em;flex:1 1 600px;max-width:900px}figure.wide{flex-basis:100%;max-width:1400px}
figure img{width:100%;height:auto;border:1px solid #eaeef2}figcaption{color:#57606a;font-size:13px}
"""
SCRIPT = """
document.querySelectorAll('table.sortable').forEach(function (table) {
  table.querySelectorAll('th').forEach(function (th, col) {
    th.addEventListener('click', function () {
      var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
      var asc = !th.classList.contains('sorted-asc');
      table.querySelectorAll('th').forEach(function (h) { h.classList.remove('sorted-asc', 'sorted-desc'); });
      th.classList.add(asc ? 'sorted-asc' : 'sorted-desc');
      function key(row) {
        var text = row.cells[col].textContent.trim(), x = parseFloat(text.replace('<', ''));
        return text === '–' ? null : (isNaN(x) ? text : x);
      }
      rows.sort(function (a, b) {
        var x = key(a), y = key(b);
        if (x === null || y === null) { return x === y ? 0 : (x === null ? 1 : -1); }
        var c = typeof x === typeof y ? (x < y ? -1 : x > y ? 1 : 0) : (typeof x === 'number' ? -1 : 1);
        return asc ? c : -c;
      });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
});
"""


def table_html(t: Table, csv: str | None = None) -> str:
    """A table's caption (its definitions left out), its blocks and footnotes; ``csv``: the file with every column."""
    caption, _ = strip_definitions(t.caption)
    out = [f'<p class="caption"><b>{escape(t.name)}.</b> {escape(caption)}'
           + (f' <a href="{escape(csv)}">Every column: {escape(Path(csv).name)}</a>.' if csv else "") + "</p>"]
    v = view(t)
    for b in v.blocks:
        if b.context:
            out.append('<p class="context">' + " · ".join(f"{escape(h)}: <b>{escape(x)}</b>" for h, x in b.context)
                       + "</p>")
        head = "".join(f"<th>{escape(h)}</th>" for _, h, _ in b.columns)
        body = "".join("<tr>" + "".join(f'<td{"" if f == "" else " class=num"}>{escape(c)}</td>'
                                        for (_, _, f), c in zip(b.columns, row)) + "</tr>" for row in b.rows)
        out.append(f'<div class="scroll"><table class="sortable"><thead><tr>{head}</tr></thead>'
                   f"<tbody>{body}</tbody></table></div>")
        if b.aside:
            out.append('<ul class="notes">' + "".join(f"<li>#{escape(n)} {escape(h)}: {escape(x)}</li>"
                                                      for n, h, x in b.aside) + "</ul>")
    if v.equal:
        out.append('<p class="notes">Equal in every row, shown once: '
                   + "; ".join(f"{escape(a)} = {escape(b)}" for a, b in v.equal) + ".</p>")
    if t.footnotes:
        out.append('<ol class="notes">' + "".join(f"<li>{escape(n)}</li>" for n in t.footnotes) + "</ol>")
    return "\n".join(out)


def figure_html(png: Path, caption: str) -> str:
    """The PNG embedded (base64); a figure more than twice as wide as high (three panels) gets the page's width."""
    raw = Path(png).read_bytes()
    width, height = struct.unpack(">II", raw[16:24])   # the PNG header's IHDR chunk
    wide = ' class="wide"' if width > 2 * height else ""
    return (f'<figure{wide}><img alt="{escape(png.stem)}" width="{width}" height="{height}" '
            f'src="data:image/png;base64,{base64.b64encode(raw).decode("ascii")}">'
            f"<figcaption>{escape(caption)}</figcaption></figure>")


def definitions_used(tables) -> list[str]:
    """The definitions the tables' captions cite, each once, in ``definitions.DEFINITIONS``' order."""
    return list(dict.fromkeys(d for t in tables for d in strip_definitions(t.caption)[1]))


def page(title: str, intro: list[str], sections, csv_dir: str | None = "tables") -> str:
    """The page: ``intro`` paragraphs (text), the definitions, then per section (``layout.sections``) its question,
    tables and figures."""
    defs = definitions_used([t for s in sections for _, t in s[3]])
    nav = " ".join(f'<a href="#{key}">{escape(name)}</a>' for key, name, *_ in sections)
    parts = [f"<h1>{escape(title)}</h1>"] + [f"<p>{escape(x)}</p>" for x in intro] + [f"<nav>{nav}</nav>"]
    if defs:
        parts.append('<h2 id="definitions">Definitions</h2><ul class="defs">'
                     + "".join(f"<li>{escape(d)}</li>" for d in defs) + "</ul>")
    for key, name, question, tables, figs in sections:
        parts.append(f'<section id="{key}"><h2>{escape(name)}</h2><p class="question">{escape(question)}</p>')
        parts += [table_html(t, f"{csv_dir}/{n}.csv" if csv_dir else None) for n, t in tables]
        if figs:
            parts.append('<div class="figures">' + "".join(figure_html(d.png, d.caption) for d in figs) + "</div>")
        parts.append("</section>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>\n" + "\n".join(parts)
            + f"\n<script>{SCRIPT}</script>\n</body></html>\n")

