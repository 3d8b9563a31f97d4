"""Tools for tests, benchmarks and fuzzing; nothing in training imports this package.

Modules: ``hostile`` (seeded generator of hostile model outputs for ``scripts/fuzz_verifier.py``
and ``tests/reward/``), ``fuzz`` (the invariants a verifier result must satisfy for a hostile
case, shared by the fuzz script and the tests), ``tiny`` (tiny randomly initialised causal LMs
for fast tests and script checks), ``digits`` (the digit-copy task and its registered reward).
"""
