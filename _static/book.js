/* Exact by Construction: on a phone the theme shows the page's contents (and the chapter list)
   in a dialog that stayed open over the page after a tap on a section. A tap on a link inside
   the dialog now closes it, so the reader lands on the section, and the contents mark the
   section tapped. Jupyter Book adds every script in _static/ to every page. */
document.addEventListener("click", (event) => {
  const link = event.target.closest("dialog a[href*='#']");
  const dialog = link && link.closest("dialog");
  if (!dialog || !dialog.open) return;
  dialog.querySelectorAll("a.active").forEach((a) => {
    a.classList.remove("active");
    a.parentElement.classList.remove("active");
  });
  link.classList.add("active");
  link.parentElement.classList.add("active");
  dialog.close();
});

/* Tables for people (sc.table's "book-table"): a column whose every filled cell is a number
   (thousands separators, a true minus, %, ×, ± or a range, "× 10⁻⁵") is marked "book-num", so
   book.css right-aligns it, heading included, and the digits line up. Cells with a dash (no
   value) or "infinite" do not decide a column. */
(() => {
  const value = String.raw`[−+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?: ?× ?10[⁻⁰¹²³⁴⁵⁶⁷⁸⁹]+)?(?: ?[%×])?`;
  const numeric = new RegExp(`^${value}(?: ?(?:±|to|–) ?${value})?$`);
  const neutral = /^(?:|—|−?infinite)$/;
  const mark = (table) => {
    const rows = [...table.querySelectorAll("tbody tr")].map((r) => [...r.children]);
    const columns = Math.max(0, ...rows.map((r) => r.length));
    for (let c = 0; c < columns; c++) {
      const texts = rows.map((r) => (r[c] ? r[c].textContent.trim() : ""));
      const filled = texts.filter((t) => !neutral.test(t));
      if (!filled.length || !filled.every((t) => numeric.test(t))) continue;
      rows.forEach((r) => r[c] && r[c].classList.add("book-num"));
      table.querySelectorAll("thead tr").forEach((r) => {
        if (r.children.length === columns && r.children[c]) r.children[c].classList.add("book-num");
      });
    }
  };
  const run = () => document.querySelectorAll("table.book-table").forEach(mark);
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", run);
  else run();
})();

/* Search with context (issue 36): Sphinx shows a line of each hit's page around the match by
   fetching that page, which a browser refuses for a site opened from disk ("Failed to fetch",
   a console error per hit). Served over http (README: `python -m http.server -d _build/html`)
   the lines show; from disk the hits are listed without them. */
if (location.protocol === "file:" && typeof DOCUMENTATION_OPTIONS !== "undefined") {
  DOCUMENTATION_OPTIONS.SHOW_SEARCH_SUMMARY = false;
}

/* The theme's "Back to top" pill shows near the bottom of the screen whenever the reader
   scrolls up; on a phone it sat on chapter 5's interactive figure, over the chart a reader is
   dragging a slider for. After each scroll (once the theme has placed it), a pill that would
   cover an interactive figure moves to the top of the screen, below the header, and hides
   when it would cover one there too. */
(() => {
  const covers = (a, b) =>
    a.left < b.right && a.right > b.left && a.top < b.bottom && a.bottom > b.top;
  const place = () => {
    const pill = document.getElementById("pst-back-to-top");
    const figures = document.querySelectorAll("[data-knob]");
    if (!pill || !figures.length) return;
    pill.classList.remove("book-pill-top", "book-pill-hidden");
    if (getComputedStyle(pill).display === "none") return;
    const over = () =>
      [...figures].some((f) => covers(pill.getBoundingClientRect(), f.getBoundingClientRect()));
    if (!over()) return;
    pill.classList.add("book-pill-top");
    if (over()) pill.classList.add("book-pill-hidden");
  };
  window.addEventListener("scroll", () => requestAnimationFrame(place), { passive: true });
})();

/* Tables that fit the column (issue 36). At desktop widths a table wider than its column shows
   the columns that fit, from the left: the labels and the columns the prose cites come first
   (sc.table's `lead`). The rest fold behind a button under the table, "Show 3 more columns",
   which brings them back; the table then scrolls in its box, its labels pinned. On a phone
   every column stays and the table scrolls the same way. A table in a closed dropdown is
   measured when the dropdown opens. */
(() => {
  const DESKTOP = 960; // px: the theme's breakpoint for the side bars
  const fold = (table) => {
    const box = table.parentElement;
    if (window.innerWidth < DESKTOP || table.dataset.bookFolded || !table.checkVisibility()) return;
    const rows = [...table.rows];
    const columns = Math.max(0, ...rows.map((r) => r.cells.length));
    if (rows.some((r) => r.cells.length !== columns)) return; // spans: leave as it is
    let hidden = 0;
    while (table.getBoundingClientRect().width > box.clientWidth + 1 && columns - hidden > 2) {
      hidden += 1;
      rows.forEach((r) => r.cells[columns - hidden].classList.add("book-folded-column"));
    }
    table.dataset.bookFolded = String(hidden);
    if (!hidden) return;
    const button = document.createElement("button");
    button.type = "button";
    button.className = "book-more-columns";
    button.textContent = `Show ${hidden} more column${hidden > 1 ? "s" : ""}`;
    button.addEventListener("click", () => {
      table.querySelectorAll(".book-folded-column").forEach((c) => {
        c.classList.remove("book-folded-column");
      });
      button.remove();
    });
    box.after(button);
  };
  const run = (root) => root.querySelectorAll("main table.book-table").forEach(fold);
  document.addEventListener("toggle", (event) => run(event.target), true);
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", () => run(document));
  } else run(document);
})();
