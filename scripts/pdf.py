"""Print the single-page build of the book to one PDF with the machine's headless Chromium.

Usage: python scripts/pdf.py SINGLE_PAGE_HTML OUTPUT_PDF. Chromium runs in a network namespace
of its own where possible (`unshare -n`), with its profile and settings in a temporary folder.

The single-page build writes book/intro.html with links (`_static/...`, `_images/...`) relative
to the build's root, so the page is first copied as print.html with a <base> at that root, where
its styles, MathJax and figures resolve. The copy prints like the site reads: dropdowns open,
code the site folds left out with its "Show code cell source" toggle, and no buttons, menus or
sidebars.
"""

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def chromium():
    """Debian's chromium, or a clear error: this script never downloads a browser."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        sys.exit("make pdf needs Debian's chromium: apt-get install chromium")
    return found


def offline_prefix():
    """`unshare -n` (root) or `unshare -rn` (user namespace) when either works here, else []."""
    unshare = shutil.which("unshare")
    for flags in (["-n"], ["-r", "-n"]):
        works = unshare and subprocess.run([unshare, *flags, "true"], capture_output=True)
        if works and works.returncode == 0:
            return [unshare, *flags]
    return []


PRINT_CSS = """<style>
@media print {
  details.hide, .bd-header, .bd-header-article, .bd-sidebar-primary, .bd-sidebar-secondary,
  .prev-next-area, .bd-footer, .bd-footer-article, .bd-footer-content, .header-article-items,
  button, .toggle-button, .headerlink, .skip-link, #pst-back-to-top, .search-button,
  .sd-summary-up, .sd-summary-down { display: none !important; }
  details.sd-dropdown > summary { list-style: none; }
  details.sd-dropdown > summary::-webkit-details-marker { display: none; }
  .bd-main .bd-content .bd-article-container { max-width: 100%; }
  mjx-container[display="true"], span.math, pre, .pst-scrollable-table-container,
  div.cell_output div.output.text_html, div.proof, div.admonition, div.theorem, section.proof {
    overflow: visible !important;
  }
  div.highlight pre, .cell_input pre, .cell_output pre { white-space: pre-wrap; }
  figure, img, table, mjx-container[display="true"] { break-inside: avoid; }
}
</style>"""


def link_root(page, html):
    """The folder the page's links resolve from: its own, or the first above it where its
    stylesheets exist (the single-page build links from its root, not from book/)."""
    sheet = re.search(r'<link[^>]+href="([^"?#]+\.css)', html)
    for folder in [page.parent, *page.parent.parents]:
        if sheet is None or (folder / sheet.group(1)).exists():
            return folder
    return page.parent


def print_copy(page, copy):
    """Write the page to copy, ready to print: links resolve, dropdowns open, print styles."""
    html = page.read_text(encoding="utf-8")
    base = f'<base href="{link_root(page, html).resolve().as_uri()}/">'
    html = re.sub(r"<details(?=[^>]*\bsd-dropdown\b)", "<details open", html)
    html = html.replace("<head>", "<head>" + base, 1).replace("</head>", PRINT_CSS + "</head>", 1)
    copy.write_text(html, encoding="utf-8")
    return copy


def print_pdf(page, output):
    """Print page (an HTML file) to output with MathJax typeset; return the number of pages."""
    output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="specdec-pdf-") as home:
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": home,
            "TMPDIR": home,
            "XDG_CONFIG_HOME": home,
            "XDG_CACHE_HOME": home,
        }
        command = [
            *offline_prefix(),
            chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-extensions",
            "--no-pdf-header-footer",
            f"--user-data-dir={home}/profile",
            "--virtual-time-budget=30000",
            "--run-all-compositor-stages-before-draw",
            f"--print-to-pdf={output.resolve()}",
            page.resolve().as_uri(),
        ]
        subprocess.run(command, env=env, check=True, capture_output=True, timeout=300)
    return len(re.findall(rb"/Type\s*/Page[^s]", output.read_bytes()))


def main():
    page, output = Path(sys.argv[1]), Path(sys.argv[2])
    pages = print_pdf(print_copy(page, page.with_name("print.html")), output)
    if pages < 2:
        sys.exit(f"{output}: {pages} page(s); the print failed")
    print(f"The book as one PDF: {output} ({pages} pages)")


if __name__ == "__main__":
    main()
