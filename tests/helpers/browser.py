"""Render an HTML report in Debian's headless Chromium and read back what the page saw.

`check(html)` loads a copy of the page with a small script that runs on the load event and
writes its findings into the DOM (<pre id="fabricbench-checks">JSON</pre>); Chromium's
--dump-dom returns that DOM. The findings: every image's load state and natural size, and
every table cell whose text is wider than the cell, and every table wider than the page.
`screenshot(html, png)` takes Chromium's own screenshot of the first screen.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars"]

SCRIPT = """<script>
window.addEventListener('load', () => {
  const imgs = [...document.images].map(i => ({alt: i.alt, complete: i.complete, width: i.naturalWidth}));
  const cells = [...document.querySelectorAll('td, th')]
    .filter(c => c.scrollWidth > c.clientWidth + 1).map(c => c.textContent.slice(0, 80));
  const page = document.documentElement.clientWidth;
  const tables = [...document.querySelectorAll('table')]
    .filter(t => t.getBoundingClientRect().right > page + 1).map(t => t.rows[0].textContent.slice(0, 80));
  document.querySelectorAll('details').forEach(d => d.open = true);
  const wide = [...document.querySelectorAll('td, th')]
    .filter(c => c.scrollWidth > c.clientWidth + 1).map(c => c.textContent.slice(0, 80));
  const pre = document.createElement('pre');
  pre.id = 'fabricbench-checks';
  pre.textContent = JSON.stringify({images: imgs, overflowing_cells: cells.concat(wide), wide_tables: tables, page});
  document.body.appendChild(pre);
});
</script>"""


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="fb-chromium-") as profile:
        return subprocess.run([chromium(), *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True,
                              timeout=timeout)


def check(html: Path, width: int = 1280, timeout: float = 120) -> dict:
    """What the page saw once loaded: {"images": [...], "overflowing_cells": [...], "wide_tables": [...]}."""
    probe = html.with_name(html.stem + ".browser-check.html")
    probe.write_text(html.read_text().replace("</body>", SCRIPT + "</body>"))
    try:
        res = _run([f"--window-size={width},1600", "--virtual-time-budget=5000", "--dump-dom", probe.resolve().as_uri()],
                   timeout)
    finally:
        probe.unlink()
    m = re.search(r'<pre id="fabricbench-checks">(.*?)</pre>', res.stdout, re.S)
    assert m, f"chromium returned no check (rc {res.returncode}): {res.stderr[-2000:]}"
    return json.loads(m.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&"))


def screenshot(html: Path, png: Path, size: str = "1280,1600", timeout: float = 120) -> Path:
    res = _run([f"--screenshot={png.resolve()}", f"--window-size={size}", html.resolve().as_uri()], timeout)
    assert png.is_file(), f"chromium wrote no screenshot (rc {res.returncode}): {res.stderr[-2000:]}"
    return png
