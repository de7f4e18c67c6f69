"""The code of *Exact by Construction*, one module per idea; `specdec_core` gathers the names."""
