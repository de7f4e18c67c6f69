/* Chapter 5's knob: sliders for w, γ and c over two uPlot charts (specdec/knob.py inlines this
   file after uPlot and the data). The data are the core's exact α(w) on a grid of w; this file
   applies Equation 1 and Theorem 3.8 to them, summed in the order sc.expected_tokens sums, and
   tests/test_knob.py checks its numbers against the core's. */
(function () {
  "use strict";

  function tokens(alpha, gamma) { // Equation 1: E[tokens per call] = 1 + α + … + α^γ
    let total = 0;
    for (let i = 0; i <= gamma; i++) total += Math.pow(alpha, i);
    return total;
  }

  function speedup(alpha, gamma, c) { // Theorem 3.8: a step costs γc + 1 target calls
    return tokens(alpha, gamma) / (gamma * c + 1);
  }

  function bestGamma(alpha, c, maxGamma) { // the γ ≤ maxGamma of the largest speedup; ties: smaller
    let best = 0;
    for (let g = 1; g <= maxGamma; g++) {
      if (speedup(alpha, g, c) > speedup(alpha, best, c)) best = g;
    }
    return best;
  }

  const fixed = (x, digits) => x.toFixed(digits);
  const only = (n, i, value) => Array.from({ length: n }, (_, k) => (k === i ? value : null));

  function chart(root, element, x, labels, xLabel, integers) {
    const [blue, orange, grey] = root.knobData.colors;
    const font = "13px system-ui, sans-serif";
    const ink = () => getComputedStyle(root).color; // the page's text colour, light or dark
    const faint = { stroke: "rgba(128, 128, 128, 0.3)" };
    const axis = (label) => ({ label, font, labelFont: font, stroke: ink, grid: faint,
      ticks: faint });
    const marker = (color, size) => ({ stroke: color, fill: color, width: 0, paths: () => null,
      points: { show: true, size, fill: color, stroke: color } });
    const options = {
      width: element.clientWidth, height: 230,
      cursor: { show: false }, legend: { live: false },
      scales: { x: { time: false }, y: { range: (u, lo, hi) => [0, Math.max(2, hi * 1.08)] } },
      axes: [{ ...axis(xLabel), ...(integers ? { incrs: [1, 2, 5] } : {}) },
        axis("projected speedup (×)")],
      series: [{ label: xLabel },
        { label: labels[0], stroke: blue, width: 2, points: { show: x.length < 20, size: 6 } },
        { label: labels[1], stroke: grey, width: 1.5, dash: [6, 4], points: { show: false } },
        { label: "break-even, 1×", stroke: ink, width: 1, points: { show: false } },
        { label: labels[2], ...marker(orange, 13) }],
    };
    if (labels[3]) options.series.push({ label: labels[3], ...marker(ink, 7) });
    return new uPlot(options, [x, ...options.series.slice(1).map(() => x.map(() => null))],
      element);
  }

  function init(root) {
    if (root.knobData) return;
    root.knobData = JSON.parse(root.querySelector("script.knob-data").textContent);
    const data = root.knobData;
    const n = data.alpha.length;
    const gammas = Array.from({ length: data.max_gamma + 1 }, (_, g) => g);
    const inputs = {};
    root.querySelectorAll("input[type=range]").forEach((e) => { inputs[e.name] = e; });
    const [byGamma, byW] = root.querySelectorAll(".knob-chart");
    const charts = [
      chart(root, byGamma, gammas, ["at this w and c", "tokens per call (c = 0)", "chosen γ",
        `best γ ≤ ${data.max_gamma}`], "γ, drafts per step", true),
      chart(root, byW, data.w, ["at this γ and c", "tokens per call (c = 0)", "chosen w"],
        "draft weight w"),
    ];
    const say = (name, text) => { root.querySelector(`[data-say=${name}]`).textContent = text; };

    function update() {
      const i = Math.round(Number(inputs.w.value) * (n - 1));
      const gamma = Number(inputs.gamma.value);
      const c = Number(inputs.c.value);
      const alpha = data.alpha[i];
      const best = bestGamma(alpha, c, data.max_gamma);
      const atGamma = gammas.map((g) => speedup(alpha, g, c));
      const atW = data.alpha.map((a) => speedup(a, gamma, c));
      charts[0].setData([gammas, atGamma, gammas.map((g) => tokens(alpha, g)),
        gammas.map(() => 1), only(gammas.length, gamma, atGamma[gamma]),
        only(gammas.length, best, atGamma[best])]);
      charts[1].setData([data.w, atW, data.alpha.map((a) => tokens(a, gamma)),
        data.w.map(() => 1), only(n, i, atW[i])]);
      say("w", fixed(data.w[i], 2));
      say("gamma", String(gamma));
      say("c", fixed(c, 2));
      say("alpha", fixed(alpha, 3));
      say("tokens", fixed(tokens(alpha, gamma), 2));
      say("speedup", fixed(atGamma[gamma], 2));
      say("best", `${best}, at ${fixed(atGamma[best], 2)}×`);
      say("title-gamma", `w = ${fixed(data.w[i], 2)}, c = ${fixed(c, 2)}`);
      say("title-w", `γ = ${gamma}, c = ${fixed(c, 2)}`);
    }

    root.querySelector(".knob-controls").addEventListener("input", update); // the wiring
    const resize = () => charts.forEach((u) => {
      const width = u.root.parentElement.clientWidth;
      if (width !== u.width) u.setSize({ width, height: u.height });
    });
    new ResizeObserver(resize).observe(root);
    new MutationObserver(() => charts.forEach((u) => u.redraw(false))) // the theme's switch
      .observe(document.documentElement, { attributes: true, attributeFilter: ["data-theme"] });
    root.querySelector(".knob-fallback").hidden = true;
    update();
  }

  window.specdecKnob = { tokens, speedup, bestGamma };
  document.querySelectorAll("[data-knob]").forEach(init);
})();
