"""A stand-in for transformers in CI: only generation.utils._speculative_sampling."""
