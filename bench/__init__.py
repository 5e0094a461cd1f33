"""Benchmarks for jetspec_kernels: one script per op plus end to end (see bench/README.md).

Run a script directly (``python bench/bench_tree_attention.py --quick``) or as a module
(``python -m bench.bench_tree_attention``); each also exposes ``main(argv) -> int``.
"""
