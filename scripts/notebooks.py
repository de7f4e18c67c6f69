"""Stand-alone notebooks from the executed chapters, for readers who run them outside the book.

A chapter's source is MyST Markdown whose text holds roles and directives that only the site
build understands ({glue:text}, {literalinclude}, {glue:figure}, {numref}, {cite:p}, ...). A
notebook opened in a plain JupyterLab would show them raw. This module takes each chapter as the
build executed it (_build/jupyter_execute) and replaces every role and directive by what the site
shows: glued numbers formatted exactly as myst-nb formats them, included code as a code block,
glued figures as an image with their number and caption, references as text. Code cells keep
their code and the outputs the site shows; `from myst_nb import glue` becomes a stand-in, so the
notebooks run without myst-nb. An unknown role or directive stops the build, so nothing raw can
slip through.
"""

import hashlib
import json
import re
import shutil
import tomllib
import zipfile
from pathlib import Path

import nbformat

INSTALL = "python -m pip install -r requirements.txt jupyterlab"
FOLDER = "exact-by-construction"  # the archive's one top-level folder
BOOK = "Exact by Construction"
NOT_IN_ARCHIVE = {"myst-nb"}  # the notebooks carry a stand-in for its glue
GLUE_IMPORT = "from myst_nb import glue"
GLUE_STANDIN = '''def glue(name, value, display=True):
    """Stand-in for the book's glue: the text of this notebook already shows the values."""
    if display:
        from IPython.display import display as show

        show(value)'''
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|:{3,})\s*(?:\{(?P<name>[^}]+)\})?(?P<arg>.*)$")
ROLE = re.compile(r"\{(?P<name>[a-z][a-z0-9:_-]*)\}`(?P<text>[^`]*)`")
TARGET = re.compile(r"^\s*\([\w.:-]+\)=\s*$")
# The site's "Download this chapter as a notebook <...>, or run it with `make lab`." sentence.
DOWNLOAD_SENTENCE = re.compile(r"\{download\}`Download this chapter[^`]*`[^.]*\.\s*")
NOTATION = "book/notation"  # shipped in the archive as notation.md, linked from the notebooks
KINDS = ("theorem", "lemma", "corollary", "proposition", "definition", "remark", "example")
PRF_DIRECTIVES = {f"prf:{k}" for k in KINDS}
ADMONITIONS = {"note", "tip", "warning", "important", "caution", "attention", "hint", "seealso"}
GLUE_ROLES = {"glue", "glue:", "glue:any", "glue:text", "glue:md"}


def opening(title, archive_name):
    """The first cell of a chapter's notebook: what to do from the folder that holds it."""
    named = "" if title == BOOK else f", “{title}”"  # the front page has the book's title
    return (
        f"*{BOOK}*{named}, with the numbers and figures of the book's build. "
        f"To run it again, in this notebook's folder (`{FOLDER}/`, which also holds "
        f"`specdec_core.py`, `specdec/` and `requirements.txt`): `{INSTALL}`, then "
        f"`jupyter lab`. A copy downloaded alone from a chapter page needs that folder: it is "
        f"the archive `{archive_name}` on the book's front page."
    )


class UnknownSyntax(ValueError):
    """A role or directive this converter does not know: add it here rather than ship it raw."""


def _explicit(text):
    """('title', 'target') of a role's text 'title <target>', or (None, text)."""
    match = re.fullmatch(r"(?s)(.*?)\s*<([^<>]+)>", text.strip())
    return (match.group(1), match.group(2)) if match else (None, text.strip())


class Converter:
    """Converts the chapters of one HTML build; `app` is the Sphinx application."""

    def __init__(self, app, root):
        self.app, self.env, self.root = app, app.env, root
        self.executed = Path(app.outdir).parent / "jupyter_execute"
        self.glue = {}
        for path in self.executed.rglob("*.glue.json"):
            docname = path.relative_to(self.executed).as_posix().removesuffix(".glue.json")
            self.glue[docname] = json.loads(path.read_text())
        self.bib = self._bibliography()
        self.prf_titles = self._prf_titles()
        self.pages = {}  # docname -> its file in the archive, for links between the pages

    # ---- look-ups --------------------------------------------------------------------

    def _bibliography(self):
        """key -> (short in-text form, full entry with its link) from the book's bib files."""
        from pybtex.database import parse_file

        entries = {}
        for name in self.app.config.bibtex_bibfiles:
            for key, entry in parse_file(str(self.root / name)).entries.items():
                people = entry.persons.get("author", [])
                lasts = [" ".join(p.last_names).replace("{", "").replace("}", "") for p in people]
                year = entry.fields.get("year", "")
                title = entry.fields.get("title", "").replace("{", "").replace("}", "")
                who = (lasts or [title])[0] + (" et al." if len(lasts) > 2 else "")
                if len(lasts) == 2:
                    who = f"{lasts[0]} and {lasts[1]}"
                link = entry.fields.get("url") or (
                    f"https://doi.org/{entry.fields['doi']}" if "doi" in entry.fields else ""
                )
                full = f"{', '.join(lasts)} ({year}). *{title}*." + (f" <{link}>" if link else "")
                entries[key] = (who, year, full)
        return entries

    def _prf_titles(self):
        """label -> 'Theorem 2.1' (as the site numbers it) for every sphinx-proof directive."""
        titles = {}
        pattern = re.compile(r"^[`:]{3,}\{prf:(\w+)\}\s*(.*)\n(?:(?::\w+:.*\n)*)", re.M)
        for docname in self.env.found_docs:
            source = Path(self.env.doc2path(docname))
            if not source.exists():
                continue
            for match in pattern.finditer(source.read_text(encoding="utf-8")):
                label = re.search(r":label:\s*(\S+)", match.group(0))
                if label:
                    kind = match.group(1).capitalize()
                    titles[label.group(1)] = f"{kind} {self._number(label.group(1))}".strip()
        return titles

    def _number(self, label):
        """'2.1' for a numbered theorem, figure or table label, as the site numbers it; else ''."""
        for numbers in self.env.toc_fignumbers.values():
            for kind in numbers.values():
                if label in kind:
                    return ".".join(map(str, kind[label]))
        return ""

    def _glued(self, docname, key):
        """The glued output named key (myst-nb's data, prefix removed) of a chapter."""
        if "::" in key:
            other, key = key.split("::", 1)
            docname = str(Path(docname).parent / other.removesuffix(".md").removesuffix(".ipynb"))
        try:
            return self.glue[docname][key]["data"]
        except KeyError:
            raise UnknownSyntax(f"{docname}: no glued value named {key!r}") from None

    def _figure_number(self, label):
        """'Fig. 2.3' for a figure label, as the site numbers it."""
        docname, node_id, _ = self.env.domaindata["std"]["labels"][label]
        number = self.env.toc_fignumbers.get(docname, {}).get("figure", {}).get(node_id)
        if number is None:
            raise UnknownSyntax(f"figure {label!r} has no number")
        return self.app.config.numfig_format["figure"] % ".".join(map(str, number))

    def _doc_title(self, docname):
        return self.env.titles[docname].astext()

    # ---- roles -----------------------------------------------------------------------

    def role(self, docname, name, text, cited):
        """What the site shows for one role, as Markdown."""
        from myst_nb.core.variables import format_plain_text

        if name in GLUE_ROLES:
            key, _, spec = text.rpartition(":") if name == "glue:text" else (text, "", "")
            if name == "glue:text" and not key:
                key, spec = text, ""
            data = self._glued(docname, key)
            if name == "glue:md" and "text/markdown" in data:
                return data["text/markdown"]
            return format_plain_text(data["text/plain"], spec)
        if name == "numref":
            title, label = _explicit(text)
            number = self._figure_number(label)
            if title:
                return title.replace("%s", number.split(" ", 1)[-1]).replace("{number}", number)
            return number
        if name in ("cite:p", "cite:t", "cite:ps", "cite:ts", "cite"):
            keys = [k.strip() for k in text.split(",")]
            cited.extend(k for k in keys if k not in cited)
            missing = [k for k in keys if k not in self.bib]
            if missing:
                raise UnknownSyntax(f"{docname}: no bibliography entry {missing}")
            if name.startswith("cite:t"):
                return "; ".join(f"{self.bib[k][0]} ({self.bib[k][1]})" for k in keys)
            return "(" + "; ".join(f"{self.bib[k][0]}, {self.bib[k][1]}" for k in keys) + ")"
        if name == "doc":
            title, target = _explicit(text)
            if target.startswith("/"):
                target = target[1:]
            else:
                target = (Path(docname).parent / target).as_posix()
            shown = title or self._doc_title(target)
            if target in self.pages:
                return f"[{shown}]({self.pages[target]})"
            return shown
        if name == "ref":
            title, label = _explicit(text)
            return title or self.env.domaindata["std"]["labels"][label][2]
        if name == "prf:ref":
            title, label = _explicit(text)
            return title or self.prf_titles[label]
        if name == "download":
            return _explicit(text)[0] or text
        if name == "math":
            return f"${text}$"
        if name == "eq":
            docname_eq, number = self.env.get_domain("math").equations[text]
            return f"({number})"
        raise UnknownSyntax(f"{docname}: role {{{name}}} is not converted")

    def roles(self, docname, line, cited):
        return ROLE.sub(lambda m: self.role(docname, m["name"], m["text"], cited), line)

    # ---- directives ------------------------------------------------------------------

    def directive(self, docname, name, arg, options, body, cell):
        """What the site shows for one directive, as Markdown (figures become attachments)."""
        if name == "literalinclude":
            from sphinx.directives.code import LiteralIncludeReader

            source = (Path(self.env.doc2path(docname)).parent / arg).resolve()
            text, _ = LiteralIncludeReader(str(source), options, self.app.config).read()
            language = options.get("language", "python")
            return [f"```{language}", *text.rstrip("\n").split("\n"), "```"]
        if name == "glue:figure":
            data = self._glued(docname, arg)
            number = self._figure_number(options["name"]) if "name" in options else ""
            image = self._attach(cell, arg, data)
            caption = self.convert_lines(docname, body, cell)
            alt = options.get("alt", arg).replace("\n", " ")
            return [f"![{alt}]({image})", "", f"**{number}.** " + " ".join(caption).strip()]
        if name in ("glue", "glue:", "glue:any"):
            data = self._glued(docname, arg)
            if "text/html" in data:
                return ["", data["text/html"], ""]
            if any(k.startswith("image/") for k in data):
                return [f"![{arg}]({self._attach(cell, arg, data)})"]
            return ["```text", data["text/plain"], "```"]
        if name in PRF_DIRECTIVES:
            number = self._number(options["label"]) if "label" in options else ""
            heading = f"{name.split(':')[1].capitalize()} {number}".strip()
            heading += f" ({arg})" if arg else ""
            inner = self.convert_lines(docname, body, cell)
            return [f"> **{heading}.**", ">", *(f"> {line}".rstrip() for line in inner)]
        if name == "prf:proof":
            inner = self.convert_lines(docname, body, cell)
            return ["*Proof.*", "", *inner, "", "$\\square$"]
        if name == "admonition" or name in ADMONITIONS:
            heading = arg or name.capitalize()
            inner = self.convert_lines(docname, body, cell)
            return [f"> **{heading}**", ">", *(f"> {line}".rstrip() for line in inner)]
        if name == "dropdown":
            inner = self.convert_lines(docname, body, cell)
            return [f"<details><summary>{arg or 'More'}</summary>", "", *inner, "", "</details>"]
        if name == "math":
            return ["$$", *body, "$$"]
        if name == "table":  # a captioned Markdown table: the caption above it, as on the site
            caption = self.convert_lines(docname, [arg], cell) if arg else []
            return [
                *(f"*{line}*" for line in caption if line),
                "",
                *self.convert_lines(docname, body, cell),
            ]
        raise UnknownSyntax(f"{docname}: directive {{{name}}} is not converted")

    def _attach(self, cell, key, data):
        """Put a glued image into the cell's attachments; return its Markdown address."""
        for mime, suffix in (("image/png", "png"), ("image/svg+xml", "svg"), ("image/jpeg", "jpg")):
            if mime in data:
                name = f"{key}.{suffix}"
                cell.setdefault("attachments", {})[name] = {mime: data[mime]}
                return f"attachment:{name}"
        raise UnknownSyntax(f"glued {key!r} has no image")

    def convert_lines(self, docname, lines, cell, cited=None):
        """Markdown lines with every role and directive replaced; citations are collected in
        cited (kept for the directives nested inside, which convert their own lines)."""
        if cited is not None:
            self._cited = cited
        cited = self._cited
        out, i = [], 0
        while i < len(lines):
            line = lines[i]
            match = FENCE.match(line)
            if TARGET.match(line) or line.lstrip().startswith("% "):
                i += 1
                continue
            if not match:
                out.append(self.roles(docname, line, cited))
                i += 1
                continue
            fence = match["fence"]
            close = re.compile(rf"^\s*{re.escape(fence[0])}{{{len(fence)},}}\s*$")
            end = next((j for j in range(i + 1, len(lines)) if close.match(lines[j])), len(lines))
            block = lines[i + 1 : end]
            if match["name"] is None:
                out.extend([line, *block, lines[end] if end < len(lines) else fence])
            else:
                options, k = {}, 0
                while k < len(block) and re.match(r"^\s*:[\w-]+:", block[k]):
                    key, _, value = block[k].strip()[1:].partition(":")
                    options[key] = value.strip()
                    k += 1
                while k < len(block) and not block[k].strip():
                    k += 1
                name, arg, indent = match["name"].strip(), match["arg"].strip(), match["indent"]
                body = [b.removeprefix(indent) for b in block[k:]]  # a directive in a list item
                made = self.directive(docname, name, arg, options, body, cell)
                out.extend(indent + m if m else m for m in made)
            i = end + 1
        return out

    # ---- notebooks -------------------------------------------------------------------

    def notebook(self, docname, archive_name):
        """The stand-alone notebook of one executed chapter."""
        executed = nbformat.read(self.executed / f"{docname}.ipynb", as_version=4)
        self._cited = []
        cells = [nbformat.v4.new_markdown_cell(opening(self._doc_title(docname), archive_name))]
        for cell in executed.cells:
            tags = set(cell.metadata.get("tags", []))
            if cell.cell_type == "markdown":
                new = nbformat.v4.new_markdown_cell("")
                source = DOWNLOAD_SENTENCE.sub("", cell.source)  # the reader has the notebook
                new.source = "\n".join(self.convert_lines(docname, source.split("\n"), new))
                cells.append(new)
            elif cell.cell_type == "code":
                source = cell.source.replace(GLUE_IMPORT, GLUE_STANDIN)
                new = nbformat.v4.new_code_cell(source, execution_count=cell.get("execution_count"))
                if not tags & {"remove-cell", "remove-output"}:
                    outputs = cell.get("outputs", [])
                    new.outputs = [o for o in outputs if "scrapbook" not in o.get("metadata", {})]
                if tags & {"hide-input", "hide-cell", "remove-input"}:
                    new.metadata["jupyter"] = {"source_hidden": True}
                cells.append(new)
        if self._cited:
            lines = ["## References", ""] + [f"- {self.bib[k][2]}" for k in self._cited]
            cells.append(nbformat.v4.new_markdown_cell("\n".join(lines)))
        for index, cell in enumerate(cells):
            digest = hashlib.sha1(f"{docname}:{index}".encode()).hexdigest()[:8]
            cell["id"] = f"cell-{index}-{digest}"
        notebook = nbformat.v4.new_notebook(cells=cells)
        notebook.metadata = {
            "kernelspec": executed.metadata.get("kernelspec", {}),
            "language_info": {"name": "python"},
        }
        nbformat.validate(notebook)
        return notebook

    def page(self, docname):
        """A page that is not a notebook (the notation) as plain Markdown, references at its end."""
        cited = []
        source = Path(self.env.doc2path(docname)).read_text(encoding="utf-8")
        lines = self.convert_lines(docname, source.split("\n"), {}, cited)
        references = ["", "## References", ""] + [f"- {self.bib[k][2]}" for k in cited]
        return "\n".join(lines + (references if cited else [])).strip() + "\n"


def _requirements(root):
    """The archive's requirements: pyproject's runtime packages and a kernel, at the book's pins."""
    pins = {}
    for line in (root / "requirements.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            pins[name.strip().lower().replace("_", "-")] = version.strip()
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    declared = (
        project["dependencies"] + project["optional-dependencies"]["book"]
    )  # the audit's, the book's
    names = [re.match(r"[\w.-]+", spec)[0].lower().replace("_", "-") for spec in declared]
    runtime = [name for name in names if name not in NOT_IN_ARCHIVE] + ["ipykernel"]
    return "".join(f"{name}=={pins[name]}\n" for name in runtime)


def _shipped(root):
    """The front door, the package and every file pyproject.toml ships with it, as paths."""
    config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    files = [root / f"{name}.py" for name in config["py-modules"]]
    for package in config["packages"]:
        patterns = ["*.py", *config.get("package-data", {}).get(package, [])]
        files += sorted({f for pattern in patterns for f in (root / package).glob(pattern)})
    return files


def write_all(app, root, outdir, archive_name, unpacked):
    """Write each chapter's notebook where the site links it, the unpacked folder and the zip.
    A build of a single page (no notation page among its documents) writes none of them."""
    if NOTATION not in app.env.found_docs:
        return
    converter = Converter(app, root)
    chapters = sorted(
        p.relative_to(converter.executed).as_posix().removesuffix(".ipynb")
        for p in converter.executed.rglob("*.ipynb")
        if p.relative_to(converter.executed).as_posix().removesuffix(".ipynb") in app.env.found_docs
    )
    converter.pages = {d: f"{Path(d).name}.ipynb" for d in chapters} | {NOTATION: "notation.md"}
    if unpacked.exists():
        shutil.rmtree(unpacked)
    unpacked.mkdir(parents=True)
    (unpacked / "notation.md").write_text(converter.page(NOTATION), encoding="utf-8")
    for docname in chapters:
        text = nbformat.writes(converter.notebook(docname, archive_name)) + "\n"
        name = f"{Path(docname).name}.ipynb"
        (unpacked / name).write_text(text, encoding="utf-8")
        targets = [outdir / "_sources" / f"{docname}.ipynb", *outdir.glob(f"_downloads/*/{name}")]
        for target in targets:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
    for path in _shipped(root):
        target = unpacked / path.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target)
    (unpacked / "requirements.txt").write_text(_requirements(root))
    (unpacked / "README.md").write_text(
        "# Exact by Construction: the chapters as notebooks\n\n"
        f"With Python 3.11 or later, in this folder:\n\n    {INSTALL}\n    jupyter lab\n\n"
        "Each notebook shows the numbers and figures of the book's build; running it computes "
        "them again from seeded generators (timings excepted). `notation.md` lists the symbols.\n"
    )
    with zipfile.ZipFile(outdir / archive_name, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(p for p in unpacked.rglob("*") if p.is_file()):
            name = path.relative_to(unpacked).as_posix()
            info = zipfile.ZipInfo(f"{FOLDER}/{name}", (2026, 1, 1, 0, 0, 0))
            info.compress_type, info.external_attr = zipfile.ZIP_DEFLATED, 0o644 << 16
            archive.writestr(info, path.read_bytes())
