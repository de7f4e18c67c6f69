"""Exact by Construction: the book's front door. Every chapter runs `import specdec_core as sc`.

Speculative decoding after Leviathan, Kalman & Matias (2023) and Chen et al. (2023), in Leviathan's
letters: p is the target, q the draft. The toy target is a Laplace-smoothed character bigram over
an 80-character corpus; the draft mixes it with a unigram, q_w = w·p + (1 − w)·q0.

The code lives in `specdec`, one module per idea in the book's order; each imports only modules
above it in this list. This file gathers their public names: every name works as `sc.NAME`:

    module       idea                                                         chapters
    checks       argument checks and size limits                              all
    style        the book's figure and table style, `new_figure`, `table`        all
    models       corpus, toy target p, draft q_w, literal sampler             1
    rule         the literal Algorithm 1; `Rule`, the broken rules             2–3
    verify       the vectorised `verify` and its blocks                       3
    engine       alias sampler, batched toy engine                            1–4
    exact        laws enumerated in Fractions                                 2–3
    stats        distances, chi-square, noise references and bands            1–4
    theory       α, Equation 1, the exact chain, Theorem 3.8, optimal γ       4–5
    knob         the site's interactive figure: sliders for w, γ and c        5
    pipelines    sampling settings, the bugs real engines shipped             6
    projections  engine-shaped scenarios, exact projections of the output     6
    harness      the verifier in a child process; its time limit              6
    planted      verifiers and drafters to audit, bugs planted in them        6
    drafted      drafter mode: drafts of any number, and what must hold       6
    audit        `audit_verifier`, its suites, what a run can detect          6
    adapters     HF's and vLLM's interfaces in numpy, adapters, torch         6
    cli          the audit's command line                                     6
    engines      make engines: released engines' code audited, the record     6
    multidraft   several candidates at one position                           7
    block        block verification, tokens per call of any per-token rule    7
    lossy        verifiers that trade exactness for acceptance                7
    article      what the article and the papers report                       all
    experiments  the seeded checks of chapters 1–4                            1–4
    transformer  a numpy transformer with a KV cache, the stopwatch           8
    roofs        the machine's roofs, measured once a build; the clock        8–9
    runtime      the same transformer run by ONNX Runtime: chapter 9's clock  9
    loading      the trained pair's files, each read after every check       9
    pair         the trained pair: generation, checks, plots                  9
    exactness    `generation_test`, exactness through the real models         9
    intervals    the race's statistics: finite-N steps, intervals, coverage  9
    race         costs apart, the prediction, the race                        9
    roofline     every model's call on this machine's roofs, and an H100's    9
    figures      the book's style, every plot, `FIGURES`                      all

Each algorithm appears twice, literal as in the paper and vectorised in numpy for the Monte
Carlo, tested to agree; exact results are `fractions.Fraction`s of the integer counts.
"""

if __name__ == "__main__":  # python -m specdec_core audit TARGET: numpy and scipy only, no plots
    from specdec.cli import run

    run()

from specdec.checks import *
from specdec.style import *
from specdec.models import *
from specdec.rule import *
from specdec.verify import *
from specdec.engine import *
from specdec.exact import *
from specdec.stats import *
from specdec.theory import *
from specdec.knob import *
from specdec.pipelines import *
from specdec.projections import *
from specdec.harness import AUDIT_TIMEOUT
from specdec.planted import *
from specdec.drafted import *
from specdec.audit import *
from specdec.adapters import *
from specdec.cli import main
from specdec.multidraft import *
from specdec.block import *
from specdec.lossy import *
from specdec.article import *
from specdec.experiments import *
from specdec.pair import ACCEPTED, BONUS, PLAIN, RESIDUAL, Pair, Run, load_pair
from specdec.exactness import P_VALUE_SLACK, GenerationTest, generation_test, reproduces
from specdec.figures import *
