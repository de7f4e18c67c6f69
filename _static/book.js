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
