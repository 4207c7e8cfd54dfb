"""Command-line benchmarks (`python -m benchmarks.<name>`), each writing JSON to benchmarks/results/ with how to
reproduce it (benchmarks/common.py)."""
