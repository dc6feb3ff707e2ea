"""Evaluation tasks run on anything with `encode(list_of_str, lang=...) -> array`."""
