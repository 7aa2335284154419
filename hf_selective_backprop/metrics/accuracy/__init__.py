"""Holds the `evaluate` module ``accuracy.py``; `evaluate.load` reads the folder, not this package."""
