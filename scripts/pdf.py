"""Print the single-page build of the book to one PDF with the machine's headless Chromium.

Usage: python scripts/pdf.py SINGLE_PAGE_HTML OUTPUT_PDF. Chromium runs in a network namespace
of its own where possible (`unshare -n`), with its profile and settings in a temporary folder.
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
    pages = print_pdf(page, output)
    if pages < 2:
        sys.exit(f"{output}: {pages} page(s); the print failed")
    print(f"The book as one PDF: {output} ({pages} pages)")


if __name__ == "__main__":
    main()
