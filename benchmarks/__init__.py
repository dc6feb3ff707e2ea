"""Benchmarks and campaigns: scripts that print figures (`python benchmarks/<name>.py`), on
what `benchmarks/common.py` shares. Performance targets live here, not in timed tests."""
