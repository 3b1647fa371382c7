"""The project's one HTML toolkit: building blocks with escaping by construction, the page shell and
its one stylesheet, inline SVG charts and a tiny PNG encoder.

Both packages' reports are built with it: the validation reports here (``reports/html_report.py``)
and ``debug_module``'s run report (``debug_module/reports/page.py``).

Rules that keep the reports safe and self-contained:

* Every piece of data goes through :func:`esc` (``html.escape`` with ``quote=True``) before it is
  placed in markup, attribute values included. Only markup built by this toolkit is trusted: the
  builders (:func:`tag`, :func:`td`, :func:`table`, :func:`section`, :func:`page`) take
  :class:`Markup` (what they and :func:`trusted` return) as is and escape every other value, so a
  user's string can never become markup. There is no template language, hence no template injection.
* No external resources, no JavaScript: charts are inline SVG, the heatmap is a PNG written here
  (zlib + struct) and embedded as a ``data:`` URI. The page carries a Content-Security-Policy that
  forbids scripts and any network load, so a mistake would show up as a console error in the
  browser test rather than as a silent fetch.
"""

from __future__ import annotations

import base64
import html
import math
import struct
import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import ArrayLike

from ..jsonio import dumps_json
from ._common import BIDI_CONTROLS, as_float, fmt_num, human_bytes

__all__ = ["esc", "neutralise_bidi", "BIDI_CONTROLS", "kv_table", "lines_list", "wrap_long", "json_pre", "line_chart", "png_rgb", "colorize",
           "CSP", "BASE_CSS", "Markup", "Cell", "trusted", "content", "tag", "join", "td", "table", "section", "page",
           "cards", "png_bytes_data_uri"]

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"


_BIDI_TABLE = {ord(c): f"<U+{ord(c):04X}>" for c in BIDI_CONTROLS}
_BIDI_HTML_TABLE = {ord(c): f"&lt;U+{ord(c):04X}&gt;" for c in BIDI_CONTROLS}


def neutralise_bidi(text: str, *, markup: bool = False) -> str:
    """``text`` with every Unicode bidi control replaced by its visible name (``<U+202E>``), so user
    text cannot reorder the characters around it. Used by the HTML reports of both packages (through
    :func:`esc` and the builders here) and safe for terminals.
    Apply it before HTML escaping (the ``<``/``>`` of the marker are escaped then); ``markup=True``
    for text that is already HTML (the marker comes out escaped: ``&lt;U+202E&gt;``)."""
    return str(text).translate(_BIDI_HTML_TABLE if markup else _BIDI_TABLE)


def esc(value: object) -> str:
    """HTML-escape anything (None -> empty); quotes too, so the result is safe in attributes. Bidi
    controls are neutralised first (:func:`neutralise_bidi`)."""
    return html.escape(neutralise_bidi("" if value is None else str(value)), quote=True)


def json_pre(value: object) -> str:
    """``value`` as indented JSON in an escaped ``<pre class="json">``."""
    return f'<pre class="json">{esc(dumps_json(value, indent=1))}</pre>'


def lines_list(items: Sequence[object], cls: str = "lines") -> str:
    """Items one per line (an ordered list), each escaped: sentences, whose commas would make a
    comma-joined list ambiguous."""
    return f'<ol class="{esc(cls)}">' + "".join(f"<li>{esc(t)}</li>" for t in items) + "</ol>"


def _is_prose(value: Sequence[object]) -> bool:
    return all(isinstance(v, str) for v in value) and any(" " in v or "," in v for v in value)


def _cell(value: object, depth: int, key: str = "") -> str:
    if key.endswith("bytes") and isinstance(value, (int, float)) and not isinstance(value, bool):
        return f'<span title="{esc(fmt_num(value))} bytes">{esc(human_bytes(value))}</span>'
    if isinstance(value, Mapping):
        if not value:
            return '<span class="muted">{}</span>'
        if depth >= 2:
            return json_pre(value)
        return kv_table(value, depth=depth + 1, cls="nested")
    if isinstance(value, (list, tuple)):
        if not value:
            return '<span class="muted">none</span>'
        if _is_prose(value):
            return lines_list(value)
        if all(not isinstance(v, (Mapping, list, tuple)) for v in value) and len(value) <= 16:
            return esc(", ".join(fmt_num(v) if isinstance(v, (int, float)) else str(v) for v in value))
        return json_pre(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return esc(fmt_num(value, 6))
    if value is None:
        return '<span class="muted">&ndash;</span>'
    return wrap_long(value)


def wrap_long(value: object, limit: int = 40) -> str:
    """Escaped text; a long one (paths, hashes, sentences) in ``<span class="wrap">`` so it may break
    anywhere rather than widen the page."""
    text = esc(value)
    return f'<span class="wrap">{text}</span>' if len(str(value)) > limit else text


def kv_table(data: Mapping[str, object] | None, *, depth: int = 0, cls: str = "kv") -> str:
    """A two-column table of a mapping (nested mappings become nested tables); all escaped."""
    if not data:
        return '<p class="muted">not recorded</p>'
    rows = "".join(f"<tr><th>{esc(k)}</th><td>{_cell(v, depth, str(k))}</td></tr>"
                   for k, v in sorted(data.items(), key=lambda kv: str(kv[0])))
    return f'<table class="{esc(cls)}">{rows}</table>'


# ----------------------------------------------------------------------------- builders


class Markup(str):
    """HTML built by this toolkit: placed as is by the builders. Every other value is text and is
    escaped (:func:`content`), so a user's string cannot become markup by accident."""


class Cell(Markup):
    """A whole table cell (``<td ...>...</td>``) from :func:`td`: :func:`table` places it as is."""


def trusted(markup: str) -> Markup:
    """Mark HTML built by code (a chart from :func:`line_chart`, a :func:`kv_table`) as markup. Never
    for text that holds a user's data unescaped."""
    return markup if isinstance(markup, Markup) else Markup(markup)


def content(value: object) -> str:
    """``value`` as HTML: :class:`Markup` as is, anything else escaped with :func:`esc`."""
    return value if isinstance(value, Markup) else esc(value)


def join(parts: Iterable[object], sep: str = "") -> Markup:
    """The parts one after the other (each through :func:`content`), ``sep`` (text) between them."""
    return Markup(esc(sep).join(content(p) for p in parts))


def _attrs(attrs: Mapping[str, object]) -> str:
    """Attributes as markup: ``class_`` is ``class``, ``data_x`` is ``data-x``; None/False leave the
    attribute out, True writes it bare; every value escaped."""
    out = []
    for key, value in attrs.items():
        if value is None or value is False:
            continue
        name = key.rstrip("_").replace("_", "-")
        out.append(f" {name}" if value is True else f' {name}="{esc(value)}"')
    return "".join(out)


_VOID = frozenset({"br", "img", "meta", "hr", "input", "link"})


def tag(name: str, *children: object, **attrs: object) -> Markup:
    """One element: ``tag("a", run_id, href=f"#run-{run_id}")``. The name and attribute names come
    from code; attribute values and children that are not :class:`Markup` are escaped."""
    if name in _VOID:
        return Markup(f"<{name}{_attrs(attrs)}>")
    return Markup(f"<{name}{_attrs(attrs)}>{''.join(content(c) for c in children)}</{name}>")


def td(*children: object, cls: str | None = None) -> Cell:
    """A table cell with an optional class, for :func:`table` rows."""
    return Cell(tag("td", *children, class_=cls))


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], *, cls: str | None = None,
          scroll: bool = True) -> Markup:
    """A table with a header row: each row's values become cells (a :class:`Cell` from :func:`td`
    is placed as is, anything else goes through :func:`content`). ``scroll``: inside a
    ``<div class="scroll">`` so a wide table scrolls rather than widen the page."""
    head = tag("tr", *(tag("th", h) for h in headers))
    body = "".join(tag("tr", *(c if isinstance(c, Cell) else td(c) for c in row)) for row in rows)
    out = Markup(f"<table{_attrs({'class': cls})}>{head}{body}</table>")
    return tag("div", out, class_="scroll") if scroll else out


def section(sid: str, title: str, *body: object) -> Markup:
    """``<section id=sid>`` with an ``<h2>`` title and the body parts."""
    return tag("section", tag("h2", title), *body, id=sid)


def cards(items: Iterable[tuple[object, str]]) -> Markup:
    """Summary figures as cards: ``(value, label)`` each, the value large."""
    return tag("div", *(tag("div", tag("div", value, class_="v"), label, class_="card") for value, label in items),
               class_="cards")


def page(title: str, *body: object, css: str = "") -> str:
    """A whole self-contained document: the :data:`CSP` meta tag, the viewport, :data:`BASE_CSS`
    (plus ``css``, markup-free rules from code) and the body parts."""
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta http-equiv="Content-Security-Policy" content="{esc(CSP)}">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{esc(title)}</title><style>{BASE_CSS}{css}</style></head>\n<body>"
            + "\n".join(content(b) for b in body) + "\n</body></html>\n")


def png_bytes_data_uri(data: bytes) -> str:
    """Encoded PNG bytes (a saved plot) as a ``data:`` URI."""
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


# ----------------------------------------------------------------------------- charts

_PASS, _FAIL, _UNKNOWN, _BAD, _EXACT = "#2b6cb0", "#c53030", "#718096", "#b83280", "#2f855a"


#: The x labels' slant and the width of one character of their 9 px font (an estimate, on the wide
#: side): the margins are sized so that the longest label (``post_attention:11``) is drawn whole.
_XT_ANGLE, _XT_CHAR_PX = 40.0, 5.4
#: A longer x label (no checkpoint id is) is cut, so a strange stored name cannot stretch the chart.
_XT_MAX_CHARS = 24


def _tick(label: str) -> str:
    """An x label as drawn: whole, or cut to :data:`_XT_MAX_CHARS` with an ellipsis."""
    return label if len(label) <= _XT_MAX_CHARS else label[: _XT_MAX_CHARS - 1] + "\u2026"


def _x_label_margins(labels: Sequence[str]) -> tuple[int, int]:
    """``(left, bottom)`` room for the slanted x labels: each ends at its tick and runs down-left."""
    if not labels:
        return 0, 0
    rad = math.radians(_XT_ANGLE)
    longest = max(len(t) for t in labels) * _XT_CHAR_PX
    return math.ceil(len(labels[0]) * _XT_CHAR_PX * math.cos(rad)) + 4, math.ceil(longest * math.sin(rad)) + 20


def line_chart(
    title: str,
    labels: Sequence[str],
    series: Sequence[tuple[str, Sequence[object], str]],
    *,
    log: bool = True,
    passed: Sequence[bool | None] | None = None,
    marker_index: int | None = None,
    marker_text: str = "first divergence",
    width: int = 560,
    height: int = 200,
    chart_id: str = "",
    inf_is_exact: bool = False,
) -> str:
    """An inline SVG line chart of one or more series over the checkpoints (model order).

    ``series``: ``(name, values, colour)``; values may be None (gap), 0 (drawn on the floor of a
    log axis as a hollow triangle: exact), NaN/inf (drawn on the ceiling as a magenta cross).
    ``inf_is_exact``: +inf means an exact match (SQNR): drawn just above the frame as a green hollow
    triangle labelled "exact", not as the NaN cross. A legend line under the plot names each kind of
    off-scale marker the chart uses. ``passed``
    colours the points of the first series (red = over tolerance). ``marker_index`` draws the
    dashed first-divergence line. Returns '' when no series has a plottable value.
    """
    n = len(labels)
    vals = [[as_float(v) for v in s[1]] for s in series]
    finite = [v for s in vals for v in s if v is not None and math.isfinite(v) and (v > 0 or not log)]
    if n == 0 or not finite:
        return ""
    exact_top = inf_is_exact and any(v == math.inf for s in vals for v in s)
    x_step = max(1, math.ceil(n / 14))  # every x_step-th checkpoint is labelled
    label_left, label_bottom = _x_label_margins([_tick(str(t)) for t in labels[::x_step]])
    ml, mr, mt, mb = max(62, label_left), 26, (36 if exact_top else 26), max(46, label_bottom)
    height += mb - 46  # the plot keeps its height; the labels get their own room
    pw, ph = width - ml - mr, height - mt - mb
    if log:
        lo, hi = math.floor(math.log10(min(finite))), math.ceil(math.log10(max(finite)))
        if hi <= lo:
            hi = lo + 1

        def ty(v: float) -> float:
            return mt + ph - (math.log10(v) - lo) / (hi - lo) * ph
    else:
        lo, hi = min(finite), max(finite)
        if hi <= lo:
            lo, hi = lo - 1.0, hi + 1.0
        pad = 0.05 * (hi - lo)
        lo, hi = lo - pad, hi + pad

        def ty(v: float) -> float:
            return mt + ph - (v - lo) / (hi - lo) * ph

    def tx(i: int) -> float:
        return ml + (pw / 2 if n == 1 else i * pw / (n - 1))

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" width="{width}" height="{height}"'
           f' viewBox="0 0 {width} {height}" data-chart="{esc(chart_id)}">',
           f"<title>{esc(title)}</title>",
           f'<text x="{ml}" y="16" class="ct">{esc(title)}{" (log scale)" if log else ""}</text>',
           f'<rect x="{ml}" y="{mt}" width="{pw}" height="{ph}" fill="#fff" stroke="#cbd5e0"/>']
    # y grid + ticks
    if log:
        span = hi - lo
        step = max(1, math.ceil(span / 6))
        for d in range(lo, hi + 1, step):
            y = ty(10.0 ** d)
            out.append(f'<line x1="{ml}" x2="{ml + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#edf2f7"/>')
            out.append(f'<text x="{ml - 4}" y="{y + 3:.1f}" class="yt">1e{d}</text>')
    else:
        for k in range(5):
            v = lo + k * (hi - lo) / 4
            y = ty(v)
            out.append(f'<line x1="{ml}" x2="{ml + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#edf2f7"/>')
            out.append(f'<text x="{ml - 4}" y="{y + 3:.1f}" class="yt">{esc(fmt_num(v, 3))}</text>')
    # x labels: the checkpoint ids, slanted, each ending at its tick
    for i in range(0, n, x_step):
        x = tx(i)
        out.append(f'<text x="{x:.1f}" y="{mt + ph + 12}" class="xt" text-anchor="end" '
                   f'transform="rotate(-{_XT_ANGLE:g} {x:.1f} {mt + ph + 12})">{esc(_tick(str(labels[i])))}</text>')
    if marker_index is not None and 0 <= marker_index < n:
        x = tx(marker_index)
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{mt}" y2="{mt + ph}" stroke="{_FAIL}" stroke-dasharray="4 3"'
                   f' class="fd-line"><title>{esc(marker_text)}: {esc(labels[marker_index])}</title></line>')
    floor_y, ceil_y = mt + ph - 3, mt + 4
    used: set[str] = set()
    for si, (name, _values, colour) in enumerate(series):
        sv = vals[si]
        path: list[str] = []
        for i, v in enumerate(sv):
            if v is None or not math.isfinite(v) or (log and v <= 0):
                if len(path) > 1:
                    out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{" ".join(path)}"/>')
                path = []
                continue
            path.append(f"{tx(i):.1f},{ty(v):.1f}")
        if len(path) > 1:
            out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{" ".join(path)}"/>')
        for i, v in enumerate(sv):
            if v is None:
                continue
            x = tx(i)
            tip = f"{name} at {labels[i]}: {fmt_num(v, 6)}"
            if inf_is_exact and v == math.inf:
                used.add("exact-top")
                # above the frame (off scale), clear of the series legend inside it
                out.append(f'<g class="exact"><title>{esc(name)} at {esc(labels[i])}: +inf (exact match)</title>'
                           f'<path d="M{x:.1f},{mt - 9} l4,7 h-8 z" fill="none" stroke="{_EXACT}" stroke-width="1.5"/>'
                           f'<text x="{x + 5:.1f}" y="{mt - 2}" class="ex">exact</text></g>')
            elif not math.isfinite(v):
                used.add("nonfinite")
                out.append(f'<g class="nonfinite"><title>{esc(tip)}</title><path d="M{x - 4:.1f},{ceil_y - 4} '
                           f'l8,8 m0,-8 l-8,8" stroke="{_BAD}" stroke-width="2"/></g>')
            elif log and v <= 0:
                used.add("exact-floor")
                out.append(f'<g class="exact"><title>{esc(tip)} (exact)</title><path d="M{x:.1f},{floor_y - 5} '
                           f'l4,7 h-8 z" fill="none" stroke="{colour}"/></g>')
            else:
                fill = colour
                if si == 0 and passed is not None and i < len(passed):
                    fill = _PASS if passed[i] is True else (_FAIL if passed[i] is False else _UNKNOWN)
                out.append(f'<circle cx="{x:.1f}" cy="{ty(v):.1f}" r="3" fill="{fill}"><title>{esc(tip)}</title></circle>')
    if len(series) > 1:
        lx = ml + 8
        for name, _v, colour in series:
            out.append(f'<rect x="{lx}" y="{mt + 6}" width="10" height="3" fill="{colour}"/>'
                       f'<text x="{lx + 14}" y="{mt + 10}" class="lg">{esc(name)}</text>')
            lx += 16 + 7 * len(name)
    out.append(_marker_legend(used, width - 4, 16))
    out.append("</svg>")
    return "".join(out)


_MARKER_TEXT = {"exact-top": (_EXACT, "\u25b3 exact match (+inf)"),
                "exact-floor": ("#4a5568", "\u25b3 at the floor: exact 0"),
                "nonfinite": (_BAD, "\u00d7 NaN / inf")}


def _marker_legend(used: set[str], x: int, y: int) -> str:
    """One line, right-aligned at ``(x, y)``, naming the off-scale markers drawn (none: '')."""
    parts = []
    for kind in ("exact-top", "exact-floor", "nonfinite"):
        if kind in used:
            colour, text = _MARKER_TEXT[kind]
            parts.append(f'<tspan fill="{colour}" data-marker="{kind}">{esc(text)}</tspan>')
            parts.append("<tspan>   </tspan>")
    return f'<text x="{x}" y="{y}" class="lg mk" text-anchor="end" xml:space="preserve">{"".join(parts[:-1])}</text>' if parts else ""


# ----------------------------------------------------------------------------- heatmap PNG

# viridis at 9 stops (matplotlib's values), interpolated linearly
_VIRIDIS = [(68, 1, 84), (71, 44, 122), (59, 81, 139), (44, 113, 142), (33, 144, 141), (39, 173, 129),
            (92, 200, 99), (170, 220, 50), (253, 231, 37)]


def colorize(values: ArrayLike, *, decades: float = 8.0) -> tuple[np.ndarray, float | None, float | None]:
    """Map a 2-D array of non-negative errors (inf allowed, NaN = unknown) to RGB on a log scale.

    Returns ``(rgb uint8 HxWx3, vmin, vmax)`` with vmin/vmax the error values at the ends of the
    colour bar (None when no positive finite value). 0 maps to the lowest colour, inf to magenta,
    NaN (unknown) to light grey.
    """
    import numpy as np

    a = np.asarray(values, dtype=np.float64)
    rgb = np.zeros(a.shape + (3,), dtype=np.uint8)
    pos = np.isfinite(a) & (a > 0)
    vmin = vmax = None
    t = np.zeros(a.shape)
    if pos.any():
        la = np.log10(a[pos])
        hi = float(la.max())
        lo = max(float(la.min()), hi - decades)
        if hi <= lo:
            lo = hi - 1.0
        t[pos] = np.clip((la - lo) / (hi - lo), 0.0, 1.0)
        vmin, vmax = 10.0 ** lo, 10.0 ** hi
    stops = np.asarray(_VIRIDIS, dtype=np.float64)
    idx = t * (len(stops) - 1)
    i0 = np.clip(np.floor(idx).astype(int), 0, len(stops) - 2)
    frac = (idx - i0)[..., None]
    rgb[...] = np.round(stops[i0] * (1 - frac) + stops[i0 + 1] * frac).astype(np.uint8)
    rgb[np.isinf(a)] = (255, 0, 255)
    rgb[np.isnan(a)] = (226, 232, 240)
    return rgb, vmin, vmax


def png_rgb(pixels: ArrayLike) -> bytes:
    """Encode an ``HxWx3`` uint8 array as a PNG (8-bit RGB, no filter)."""
    import numpy as np

    px = np.ascontiguousarray(np.asarray(pixels, dtype=np.uint8))
    h, w = int(px.shape[0]), int(px.shape[1])
    raw = b"".join(b"\x00" + px[r].tobytes() for r in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def png_data_uri(pixels: ArrayLike) -> str:
    """An ``HxWx3`` uint8 array as a PNG ``data:`` URI (:func:`png_rgb`)."""
    return "data:image/png;base64," + base64.b64encode(png_rgb(pixels)).decode("ascii")


def colorbar_svg(vmin: float | None, vmax: float | None, width: int = 260) -> str:
    grad = "".join(f'<stop offset="{i / (len(_VIRIDIS) - 1):.3f}" stop-color="rgb{c}"/>' for i, c in enumerate(_VIRIDIS))
    lo = "0" if vmin is None else fmt_num(vmin, 3)
    hi = "0" if vmax is None else fmt_num(vmax, 3)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="colorbar" width="{width + 200}" height="34">'
            f'<defs><linearGradient id="vir">{grad}</linearGradient></defs>'
            f'<rect x="0" y="2" width="{width}" height="12" fill="url(#vir)"/>'
            f'<text x="0" y="28" class="lg">&#8804; {esc(lo)}</text>'
            f'<text x="{width}" y="28" class="yt">{esc(hi)} (log)</text>'
            f'<rect x="{width + 10}" y="2" width="12" height="12" fill="rgb(255,0,255)"/>'
            f'<text x="{width + 26}" y="12" class="lg">non-finite</text>'
            f'<rect x="{width + 90}" y="2" width="12" height="12" fill="rgb(226,232,240)" stroke="#a0aec0"/>'
            f'<text x="{width + 106}" y="12" class="lg">unknown</text></svg>')


BASE_CSS = """
:root{--pass:#2f855a;--fail:#c53030;--muted:#718096}
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0 auto;max-width:1280px;padding:1em 2em;color:#1a202c}
h1{font-size:1.5em;margin:.2em 0}h2{font-size:1.2em;border-bottom:1px solid #e2e8f0;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;font-size:.86em}td,th{border:1px solid #e2e8f0;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#f7fafc}td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
table.nested{font-size:1em}table.nested th{background:#fcfcfd}
tr.fail td{background:#fff5f5}tr.first td{background:#fed7d7;font-weight:600}tr.unknown td{background:#fffff0}
tr.better td.change{color:var(--pass);font-weight:600}tr.worse td{background:#fff5f5}tr.worse td.change{color:var(--fail);font-weight:600}
.verdict{padding:.8em 1em;border-radius:6px;margin:.6em 0;border:1px solid}
.verdict.ok{background:#f0fff4;border-color:#9ae6b4}.verdict.bad{background:#fff5f5;border-color:#feb2b2}.verdict.other{background:#fffff0;border-color:#faf089}
.verdict .big{font-size:1.6em;font-weight:700;letter-spacing:.03em}
.muted{color:var(--muted)}pre{background:#f7fafc;border:1px solid #e2e8f0;padding:.5em;overflow:auto;white-space:pre-wrap;word-break:break-all;margin:0}
pre.json{font-size:.85em;max-height:24em;white-space:pre;word-break:normal}nav a{margin-right:.9em}
.charts{display:flex;flex-wrap:wrap;gap:10px}svg.chart{border:1px solid #edf2f7;background:#fdfdfe}
svg text{font-family:system-ui,sans-serif}svg .ct{font-size:12px;font-weight:600}svg .yt{font-size:9px;text-anchor:end}
svg .xt{font-size:9px}svg .lg{font-size:10px}.scroll{overflow-x:auto}
img.heat{image-rendering:pixelated;image-rendering:crisp-edges;border:1px solid #a0aec0}
.note{background:#ebf8ff;border-left:4px solid #4299e1;padding:.4em .8em;margin:.5em 0}
details summary{cursor:pointer;color:#2b6cb0}td.reason{min-width:22em;max-width:40em}
h1,h3,.verdict,code,.wrap{overflow-wrap:anywhere}ol.lines{margin:0;padding-left:1.6em}
pre#command{white-space:pre-wrap;word-break:normal;overflow-wrap:anywhere}svg .ex{font-size:8px;fill:#2f855a}
nav{display:flex;flex-wrap:wrap;row-gap:.3em}svg.chart{max-width:100%;height:auto}img.heat{max-width:100%}
table.drilldown td{white-space:nowrap}table.drilldown code{overflow-wrap:normal}
.cards{display:flex;flex-wrap:wrap;gap:.8em}.card{border:1px solid #e2e8f0;border-radius:6px;padding:.6em 1em;min-width:8em}
.card .v{font-size:1.6em;font-weight:700}.v-pass{color:var(--pass);font-weight:600}.v-fail{color:var(--fail);font-weight:600}
img.plot{max-width:100%;border:1px solid #edf2f7;margin:.3em 0}details{margin:.4em 0}p,li{overflow-wrap:anywhere}.scroll+.scroll{margin-top:.5em}
table.kv td{overflow-wrap:anywhere}
@media (max-width:640px){body{padding:.5em .6em}table{display:block;overflow-x:auto;max-width:100%}section{overflow-x:auto}
table.kv{display:table;width:100%;table-layout:fixed}table.kv th{width:32%;overflow-wrap:anywhere}}
"""
