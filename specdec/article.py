"""All chapters: what the article and the papers report, for side-by-side tables.





Numbers as printed in the article (its own random streams) and in Leviathan et al.'s tables;
the speedups other systems report for themselves.
"""

# What the article reports, for side-by-side tables (its own random streams, so only the size of
# a noise-driven number is comparable, not its digits).
ARTICLE = {
    "sampling_max_gap": 0.00076,
    "one_token_max_gap": 0.00146,
    "joint_tv": 0.01523,
    "alpha_w0": 0.726,
    "tokens_w0": 2.92,
    "tokens_w1": 5.0,
    "tokens_w09": 4.7336,
    "speedup_w09_c010": 3.381,
    "speedup_w09_c025": 2.367,
    "speedup_w0_c010": 2.080,
    "speedup_w0_c025": 1.456,
    "pairs_seen": 324,
    "acceptance_gap_bound": 0.004,
    "tokens_gap_bound": 0.01,
}

# Measured α of real draft/target pairs, Leviathan et al. Table 3 (temperature 0, temperature 1).
REAL_PAIR_ALPHAS = [
    ("GPT-like 97M", "unigram", 0.03, 0.03),
    ("GPT-like 97M", "bigram", 0.05, 0.05),
    ("GPT-like 97M", "GPT-like 6M", 0.88, 0.89),
    ("T5-XXL EnDe", "unigram", 0.08, 0.07),
    ("T5-XXL EnDe", "bigram", 0.20, 0.19),
    ("T5-XXL EnDe", "T5-small", 0.75, 0.62),
    ("T5-XXL EnDe", "T5-base", 0.80, 0.68),
    ("T5-XXL EnDe", "T5-large", 0.82, 0.71),
    ("T5-XXL CNNDM", "unigram", 0.13, 0.08),
    ("T5-XXL CNNDM", "bigram", 0.23, 0.16),
    ("T5-XXL CNNDM", "T5-small", 0.65, 0.53),
    ("T5-XXL CNNDM", "T5-base", 0.73, 0.55),
    ("T5-XXL CNNDM", "T5-large", 0.74, 0.56),
    ("LaMDA 137B", "LaMDA 100M", 0.61, 0.57),
    ("LaMDA 137B", "LaMDA 2B", 0.71, 0.71),
    ("LaMDA 137B", "LaMDA 8B", 0.75, 0.74),
]

# Leviathan et al. Table 1 (c = ĉ = 0): (α, γ) -> (increase in operations, speed) as printed.
TABLE1 = {
    (0.6, 2): (1.53, 1.96),
    (0.7, 3): (1.58, 2.53),
    (0.8, 2): (1.23, 2.44),
    (0.8, 5): (1.63, 3.69),
    (0.9, 2): (1.11, 2.71),
    (0.9, 10): (1.60, 6.86),
}

# Leviathan et al. Table 2 (T5-XXL, T5-small draft): (task, temperature, gamma, alpha, speedup).
TABLE2 = [
    ("EnDe", 0, 7, 0.75, 3.4),
    ("EnDe", 1, 7, 0.62, 2.6),
    ("CNNDM", 0, 5, 0.65, 3.1),
]

# Speedups other systems report for themselves (each cited in chapter 5): (system, draft, claim).
REPORTED_SYSTEMS = [
    ("Leviathan et al. (T5-XXL)", "smaller T5 checkpoint", "2×–3× walltime, identical outputs"),
    ("Chen et al. (Chinchilla 70B)", "4B model, K = 4", "2–2.5× decoding"),
    ("Medusa-1 / Medusa-2", "extra decoding heads, tree attention", "over 2.2× / 2.3–3.6×"),
    ("EAGLE (LLaMA2-Chat 70B)", "drafting on the target's features", "2.7–3.5× latency"),
    ("Draft & Verify (LLaMA-2)", "the target with layers skipped", "up to 1.99×"),
    (
        "Lookahead decoding",
        "n-grams from the target itself, no draft model",
        "up to 1.8× (MT-bench), up to 4× (multi-GPU code)",
    ),
    ("gpt-fast", "CodeLlama-7B for CodeLlama-34B", "about 2× tokens/s"),
    ("gpt-fast", "TinyLlama-1B for Llama-7B", "about 1.3× tokens/s"),
    (
        "vLLM, low load",
        "draft model (ShareGPT) / n-gram (CNN/DailyMail)",
        "up to 1.5× / up to 2.8×",
    ),
    ("vLLM, high load", "the same", "slower than without speculation"),
]
