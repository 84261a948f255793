"""matrix.html as a browser shows it: headless Chromium renders it, runs its script, draws it.

Chromium is installed by `make chromium` (a prerequisite of `make test`); a
missing one fails these tests instead of skipping them.
"""

from __future__ import annotations

import html.parser
import json
import struct
import subprocess
import zlib
from collections import Counter
from pathlib import Path

from loadfuzz.report import html as matrix_html
from support import AWKWARD, WITH_PLUGIN, campaign, cells_of, large_campaign

CHROMIUM = Path("/usr/bin/chromium")
QUIET = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--hide-scrollbars", "--enable-logging=stderr", "--v=0",
]


def chromium(tmp_path: Path, page: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM.exists(), f"{CHROMIUM} is missing: run `make chromium`"
    ran = subprocess.run(
        [str(CHROMIUM), *QUIET, f"--user-data-dir={tmp_path / 'profile'}", *args, page.as_uri()],
        capture_output=True, text=True, timeout=180, check=True,
    )
    console = [line for line in ran.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], console  # the page logs nothing, so this is a script error
    return ran


class Elements(html.parser.HTMLParser):
    """The attributes and text of the elements with an id or a data-count-for attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.attrs: dict[str, dict[str, str]] = {}
        self.text: dict[str, str] = {}
        self.open: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {name: value or "" for name, value in attrs}
        name = values.get("id") or values.get("data-count-for") or tag
        self.attrs.setdefault(name, values)
        if "id" in values or "data-count-for" in values:
            self.open = name
            self.text[name] = ""

    def handle_endtag(self, tag: str) -> None:
        if tag in ("div", "span"):
            self.open = None

    def handle_data(self, data: str) -> None:
        if self.open:
            self.text[self.open] += data


def elements_of(dom: str) -> Elements:
    parser = Elements()
    parser.feed(dom)
    return parser


def test_the_rendered_dom_holds_every_cell_and_the_script_counted_them(tmp_path: Path) -> None:
    summary, trials = campaign(extra=AWKWARD)
    page = matrix_html.write_matrix_html(tmp_path, summary, trials)
    dom = chromium(tmp_path, page, "--dump-dom").stdout

    cells = cells_of(dom)
    assert len(cells) == WITH_PLUGIN * WITH_PLUGIN * 2
    assert cells == cells_of(page.read_text(encoding="utf-8"))
    found = elements_of(dom)
    assert found.attrs["body"].get("data-ready") == "yes"
    for outcome, count in Counter(c["data-outcome"] for c in cells).items():
        assert found.text[outcome] == f"({count})", outcome


def with_script(tmp_path: Path, page: Path, script: str) -> Path:
    """A copy of `page` that runs `script` once the page's own script has run."""
    copy = tmp_path / f"scripted-{page.name}"
    text = page.read_text(encoding="utf-8")
    copy.write_text(text.replace("</body>", f"<script>{script}</script></body>"), encoding="utf-8")
    return copy


def test_clicking_a_cell_pins_its_trial_in_the_details_box(tmp_path: Path) -> None:
    summary, trials = campaign(extra=AWKWARD)
    page = matrix_html.write_matrix_html(tmp_path, summary, trials)
    clicked = with_script(tmp_path, page, "document.querySelector('td[data-outcome=\"crash\"]')"
                                          ".dispatchEvent(new MouseEvent('click'));")
    found = elements_of(chromium(tmp_path, clicked, "--dump-dom").stdout)

    crash = summary["unexpected"][0]
    assert crash["outcome"] == "crash"
    assert "pinned" in found.attrs["details"].get("class", "").split()
    shown = found.text["details"]
    assert shown.startswith(f"{crash['sequence'][0]['lib']} -> {crash['sequence'][1]['lib']}")
    assert "outcome: crash (unexpected)" in shown
    assert shown.endswith(f"repro: {crash['repro']}")


def paeth(left: int, up: int, corner: int) -> int:
    guess = left + up - corner
    return min((abs(guess - left), left), (abs(guess - up), up), (abs(guess - corner), corner),
               key=lambda pair: pair[0])[1]


def png_pixels(path: Path) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of RGB bytes) of an 8-bit non-interlaced RGB or RGBA PNG."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    chunks: dict[bytes, list[bytes]] = {}
    at = 8
    while at < len(data):
        (length,) = struct.unpack(">I", data[at:at + 4])
        chunks.setdefault(data[at + 4:at + 8], []).append(data[at + 8:at + 8 + length])
        at += 12 + length
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", chunks[b"IHDR"][0])
    assert depth == 8 and colour in (2, 6) and interlace == 0, "unexpected PNG format"
    size = 3 if colour == 2 else 4  # bytes per pixel
    stride = width * size
    raw = zlib.decompress(b"".join(chunks[b"IDAT"]))
    rows: list[bytes] = []
    previous = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        for x in range(stride) if kind else ():  # filter 0: the bytes as they are
            left = line[x - size] if x >= size else 0
            corner = previous[x - size] if x >= size else 0
            up = previous[x]
            predicted = (0, left, up, (left + up) // 2, paeth(left, up, corner))[kind]
            line[x] = (line[x] + predicted) & 0xFF
        previous = line[:]
        if size == 4:
            del line[3::4]  # the alpha bytes
        rows.append(bytes(line))
    return width, height, rows


# Where a cell of each kind is drawn: a point just inside its top-left corner, past the
# 2px outline an unexpected cell has and clear of its glyph.
WHERE = """
var at = {};
document.querySelectorAll('td[data-outcome]').forEach(function (cell) {
  var name = cell.dataset.outcome + '/' + cell.dataset.status;
  var box = cell.getBoundingClientRect();
  if (!(name in at)) { at[name] = [Math.round(box.left) + 4, Math.round(box.top) + 4]; }
});
document.body.dataset.at = JSON.stringify(at);
"""


def test_a_screenshot_of_the_19_by_19_matrix_shows_each_cell_in_its_colour(
        tmp_path: Path) -> None:
    summary, trials = campaign()
    page = matrix_html.write_matrix_html(tmp_path, summary, trials)
    size = "--window-size=1100,960"  # the global panel: the local one is drawn below it
    shot = tmp_path / "matrix.png"
    chromium(tmp_path, page, f"--screenshot={shot}", size)
    dom = chromium(tmp_path, with_script(tmp_path, page, WHERE), "--dump-dom", size).stdout
    at = json.loads(elements_of(dom).attrs["body"]["data-at"])

    width, height, rows = png_pixels(shot)
    assert (width, height) == (1100, 960)

    def pixel(name: str) -> tuple[int, ...]:
        x, y = at[name]
        return tuple(rows[y][3 * x:3 * x + 3])

    def colour(state: str, opacity: float = 1.0) -> tuple[int, ...]:
        rgb = bytes.fromhex(matrix_html.CELL_STYLES[state][1][1:])
        return tuple(round(opacity * c + (1 - opacity) * 255) for c in rgb)  # over white

    for state in ("crash", "timeout", "abort"):  # the unexpected findings in the global panel
        assert pixel(f"{state}/unexpected") == colour(state), state
    assert pixel("clean/clean") == colour("clean")
    faded = pixel("reregister/expected")
    assert all(abs(a - b) <= 2 for a, b in zip(faded, colour("reregister", 0.45), strict=True))


def test_in_a_large_matrix_a_bare_cell_still_says_its_pair_and_outcome(tmp_path: Path) -> None:
    summary, trials = large_campaign(libraries=matrix_html.COMPACT_FROM)
    page = matrix_html.write_matrix_html(tmp_path, summary, trials)
    first, second = (step["lib"] for step in trials[0]["sequence"])
    clicked = with_script(tmp_path, page, "document.querySelector('table.matrix td.clean')"
                                          ".dispatchEvent(new MouseEvent('click', {bubbles: true}));")
    found = elements_of(chromium(tmp_path, clicked, "--dump-dom").stdout)
    assert "pinned" in found.attrs["details"].get("class", "").split()
    assert found.text["details"] == f"{first} -> {second} @ global\noutcome: clean (clean)"
    rows = len({t["sequence"][0]["lib"] for t in trials})  # a shard shows the rows it ran
    cells = rows * matrix_html.COMPACT_FROM
    assert found.text["clean"] == f"({len(trials) - 1})"
    assert found.text["reregister"] == "(1)"
    assert found.text["not-run"] == f"({cells - rows - len(trials)})"
