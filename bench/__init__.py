"""Benchmarks: each prints its figure beside a ceiling measured in the same run."""
