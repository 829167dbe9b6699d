"""Data sets: the shared JSONL record schema, real benchmarks and the synthetic countdown task."""
