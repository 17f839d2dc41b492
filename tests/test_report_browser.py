"""report.html in a real browser (headless Chromium, Debian's ``chromium`` package; marker ``browser``, run by .ci/run):
the page loads without a console error and its screenshot shows the figures (matplotlib's orange and blue drawn from
the embedded PNGs, absent from the same page without its figures). Each check is tried on a page made to fail it."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mars_bench.report import write_report

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures" / "results"
ORANGE, BLUE = (255, 127, 14), (31, 119, 180)   # figures.COLORS: mars, sd


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    assert exe, "the browser tier needs Chromium: apt-get install -y chromium (.ci/run installs it)"
    return exe


def render(page: Path, shot: Path, height: int = 6000) -> str:
    """Load ``page`` headless, save a 1400 x ``height`` screenshot; returns what Chromium logged (the page's console
    messages among it)."""
    out = subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                          "--enable-logging=stderr", "--v=0", f"--window-size=1400,{height}",
                          f"--screenshot={shot}", page.resolve().as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and shot.is_file(), out.stderr[-2000:]
    return out.stderr


def console_errors(log: str) -> list[str]:
    """The console's errors and uncaught exceptions in Chromium's log (its CONSOLE lines at level ERROR, and any
    'Uncaught' one)."""
    return [line for line in log.splitlines()
            if "CONSOLE" in line and ("ERROR" in line.split("CONSOLE")[0] or "Uncaught" in line)]


def color_share(shot: Path, rgb: tuple[int, int, int], tol: int = 12) -> float:
    px = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    return float((np.abs(px - np.array(rgb)).max(axis=-1) <= tol).mean())


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("rep")
    write_report(FIX, out)
    return out / "report.html"


def test_the_page_loads_without_console_errors(report, tmp_path):
    log = render(report, tmp_path / "page.png")
    assert not console_errors(log), console_errors(log)
    broken = tmp_path / "broken.html"   # the check sees an error when there is one
    broken.write_text(report.read_text(encoding="utf-8").replace("<script>", "<script>undefinedFunction();", 1),
                      encoding="utf-8")
    assert console_errors(render(broken, tmp_path / "broken.png"))


def test_the_screenshot_shows_the_figures(report, tmp_path):
    render(report, tmp_path / "page.png")
    bare = tmp_path / "bare.html"
    bare.write_text(re.sub(r"<figure.*?</figure>", "", report.read_text(encoding="utf-8"), flags=re.S),
                    encoding="utf-8")
    render(bare, tmp_path / "bare.png")
    for rgb in (ORANGE, BLUE):
        with_figures, without = color_share(tmp_path / "page.png", rgb), color_share(tmp_path / "bare.png", rgb)
        assert with_figures > 0.002 and without < with_figures / 20, (rgb, with_figures, without)
