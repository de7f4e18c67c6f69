"""Sphinx extension of the book (registered in _config.yml under sphinx.local_extensions).

It does four things the theme and myst-nb do not:
- stamps every page with the project's version and the date of the sources it was built from;
- offers each chapter as a notebook in the theme's download menu;
- when the HTML build finishes, turns each executed chapter into a stand-alone notebook (the
  `notebooks` module does the conversion) and packs them, with the core and its requirements,
  into one archive: exact-by-construction-notebooks.zip at the root of the site;
- keeps a first visit light: the theme's icon script keeps only the icons the site uses (1.5 MB
  down to 80 kB), the figures are stored as 256-colour PNGs (about a third of the bytes), and
  pages with math load MathJax's TeX input, HTML output and assistive MathML through its own
  loader (0.76 MB) instead of the combined file (1.16 MB), whose extra weight is the
  right-click menu.
"""

import datetime
import io
import os
import re
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARCHIVE = "exact-by-construction-notebooks.zip"
NOTEBOOKS_DIR = "notebooks"  # _build/notebooks: the archive unpacked, for `make lab`


def _git(*args):
    """Output of a git command in the repository, or '' outside a git checkout."""
    try:
        result = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return result.stdout.strip()


def build_stamp():
    """'version 1.0.0, commit abc1234 of 2026-11-30': the same for two builds of one commit."""
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    commit, epoch = _git("log", "-1", "--format=%h"), _git("log", "-1", "--format=%ct")
    epoch = os.environ.get("SOURCE_DATE_EPOCH") or epoch
    day = (
        datetime.datetime.fromtimestamp(int(epoch), datetime.UTC).date().isoformat()
        if epoch
        else datetime.date.today().isoformat()
    )
    dirty = " with local changes" if _git("status", "--porcelain", "--untracked-files=no") else ""
    where = f", commit {commit}{dirty}" if commit else ""
    return f"version {version}{where}, built from the sources of {day}"


def _stamp_footer(app, config):
    """Put the build stamp into the theme's footer of every page."""
    stamp = f'<p class="book-build-stamp">Exact by Construction, {build_stamp()}.</p>'
    options = dict(config.html_theme_options or {})
    options["extra_footer"] = (options.get("extra_footer") or "") + stamp
    config.html_theme_options = options


def _use_mathjax_loader(app, config):
    """Point pages with math to MATHJAX_LOADER (sphinx-mathjax-offline sets its own path)."""
    config.mathjax_path = MATHJAX_LOADER


def _is_chapter(app, pagename):
    """True for a page executed as a notebook (a chapter), which therefore has a .ipynb."""
    return app.env.metadata.get(pagename, {}).get("kernelspec") is not None


def _offer_notebook(app, pagename, templatename, context, doctree):
    """Name the chapter's notebook so the theme's download menu offers it as .ipynb."""
    if doctree is not None and _is_chapter(app, pagename):
        context["ipynb_source"] = f"{pagename}.ipynb"


def _reread_front_page(app, env, added, changed, removed):
    """The front page reads every chapter (reading times, the article's numbers): read it again
    whenever another page is, so that an edit to a chapter alone cannot leave it stale."""
    return [app.config.root_doc] if changed or added else []


def _write_notebooks(app, exception):
    """After a successful HTML build: the stand-alone notebooks, and the archive of all of them."""
    if exception is not None or app.builder.name != "html":
        return
    from notebooks import write_all  # beside this file; imported late: it needs the venv

    write_all(app, ROOT, Path(app.outdir), ARCHIVE, Path(app.outdir).parent / NOTEBOOKS_DIR)


# One icon of Font Awesome's bundle: "name":[width,height,[aliases],"unicode",path or paths].
# Minified, a name that is a valid identifier loses its quotes.
ICON = re.compile(
    r'(?:"([a-z0-9-]+)"|([A-Za-z0-9_$]+)):\[\d+,\d+,\[([^\]]*)\],"[0-9a-f]+",'
    r'(?:"[^"]*"|\[[^\]]*\])\],?'
)


def used_icons(outdir):
    """Every fa-NAME the built pages and the theme's other scripts mention."""
    names = set()
    files = [*outdir.rglob("*.html"), *(outdir / "_static" / "scripts").glob("*.js")]
    for path in files:
        if path.name != "fontawesome.js":
            names |= set(re.findall(r"fa-([a-z0-9-]+)", path.read_text(errors="replace")))
    return names


def subset_icons(script, keep):
    """Font Awesome's bundle without the icons not in keep (matched by name or alias)."""

    def entry(match):
        names = {match.group(1) or match.group(2), *re.findall(r'"([a-z0-9-]+)"', match.group(3))}
        return match.group(0) if names & keep else ""

    return ICON.sub(entry, script)


# A private-use codepoint in CSS, escaped (\f107) or literal: an icon glyph of the icon font.
GLYPH = re.compile(r"\\([ef][0-9a-f]{3})|([\ue000-\uf8ff])")
ICON_FONT = "vendor/fontawesome/webfonts/fa-solid-900.ttf"
USED_ICON_FONT = "fa-solid-900-used.woff"  # _static/book.css declares it after the theme's font


def css_glyphs(css, used):
    """Codepoints the stylesheet can draw from the icon font: all but the unused .fa-NAME rules."""
    keep = set()
    for selectors, body in re.findall(r"([^{}]+)\{([^{}]*)\}", css):
        names = set(re.findall(r"\.fa-([a-z0-9-]+)", selectors))
        icon_rule = all(s.strip().startswith(".fa-") for s in selectors.split(","))
        if icon_rule and names and not names & used:
            continue
        keep |= {
            int(escaped, 16) if escaped else ord(char) for escaped, char in GLYPH.findall(body)
        }
    return keep


def subset_font(font, codepoints):
    """The font with only the given codepoints, as WOFF bytes."""
    from fontTools import subset

    options = subset.Options()
    options.flavor = "woff"
    loaded = subset.load_font(str(font), options)
    subsetter = subset.Subsetter(options)
    subsetter.populate(unicodes=codepoints)
    subsetter.subset(loaded)
    out = io.BytesIO()
    subset.save_font(loaded, out, options)
    return out.getvalue()


def optimise_png(data):
    """A figure's PNG as 256 colours (its text chunks and resolution kept), if that is smaller."""
    from PIL import Image, PngImagePlugin

    with Image.open(io.BytesIO(data)) as image:
        if image.mode == "P":
            return data
        info = PngImagePlugin.PngInfo()
        for key, value in image.text.items():
            info.add_text(key, value)
        small = image.convert("RGB").quantize(256, dither=Image.Dither.NONE)
        out = io.BytesIO()
        small.save(out, "PNG", optimize=True, pnginfo=info, dpi=image.info.get("dpi", (72, 72)))
    return out.getvalue() if out.tell() < len(data) else data


# _config.yml's mathjax_path: Sphinx adds it to pages with math only. It sits beside the offline
# MathJax copy and asks MathJax's loader for the parts the pages use, keeping any configuration
# Sphinx set before it.
MATHJAX_LOADER = "book-mathjax.js"
MATHJAX_SCRIPT = """/* MathJax for this book: TeX in, HTML out, MathML for screen readers */
(() => {
  const here = document.currentScript.src.replace(/[^/]*$/, "");
  const config = window.MathJax || {};
  config.loader = {
    load: ["input/tex", "output/chtml", "a11y/assistive-mml"],
    paths: { mathjax: here + "mathjax" },
  };
  window.MathJax = config;
  const startup = document.createElement("script");
  startup.src = here + "mathjax/startup.js";
  document.head.appendChild(startup);
})();
"""


def _lighten(app, exception):
    """After a successful build: subset the icon script, shrink every figure, and serve the
    book's own stylesheet and script without their comments."""
    if exception is not None or app.builder.format != "html":
        return
    outdir = Path(app.outdir)
    (outdir / "_static" / MATHJAX_LOADER).write_text(MATHJAX_SCRIPT)
    script = outdir / "_static" / "scripts" / "fontawesome.js"
    used = used_icons(outdir)
    if script.exists():
        script.write_text(subset_icons(script.read_text(), used))
    static = outdir / "_static"
    if (static / ICON_FONT).exists():
        css = "".join(
            p.read_text(errors="replace") for p in static.rglob("*.css") if "vendor" not in p.parts
        )
        (static / USED_ICON_FONT).write_bytes(
            subset_font(static / ICON_FONT, css_glyphs(css, used))
        )
    for png in (outdir / "_images").glob("*.png"):
        data = png.read_bytes()
        smaller = optimise_png(data)
        if smaller is not data:
            png.write_bytes(smaller)
    for name in BOOK_STATIC:
        if (static / name).exists():
            (static / name).write_text(without_comments((static / name).read_text()))


BOOK_STATIC = ("book.css", "book.js")  # _static/: commented for maintainers, served without


def without_comments(text):
    """CSS or JavaScript without its /* */ comments, indentation and blank lines (about 6 kB of
    the 14 kB every page loads; chapter 5 sits at its 2 MB page-weight budget). Neither file has
    "/*" inside a string, a regular expression or a url()."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return "".join(line.strip() + "\n" for line in text.splitlines() if line.strip())


def setup(app):
    app.connect("config-inited", _stamp_footer)
    app.connect("config-inited", _use_mathjax_loader)
    app.connect("html-page-context", _offer_notebook, priority=400)
    app.connect("env-get-outdated", _reread_front_page)
    app.connect("build-finished", _write_notebooks)
    app.connect("build-finished", _lighten)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
