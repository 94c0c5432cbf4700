"""Benchmarks: time, memory and bytes of fedsketch, against a plain loop and against pfl-research."""
