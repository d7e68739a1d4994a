// MathJax 3 (tex-svg-full.js, copied into the site from an installed package by docs/hooks.py): typesets the
// \( \) and \[ \] spans that pymdownx.arithmatex writes, on the first page load and after each page change.
window.MathJax = {
  tex: { inlineMath: [["\\(", "\\)"]], displayMath: [["\\[", "\\]"]], processEscapes: true, processEnvironments: true },
  options: { ignoreHtmlClass: ".*|", processHtmlClass: "arithmatex" },
  startup: { typeset: true },
};

// Material's document$ also fires on the first load, before MathJax has started (it then typesets by itself).
if (typeof document$ !== "undefined") {
  document$.subscribe(() => {
    if (window.MathJax && typeof window.MathJax.typesetPromise === "function") {
      MathJax.typesetClear();
      MathJax.texReset();
      MathJax.typesetPromise();
    }
  });
}
