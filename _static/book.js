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
