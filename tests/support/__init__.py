"""Helpers for the tests: models, comparisons, child processes.  Fixtures live in conftest.py;
no test module imports another, and helpers are imported from here."""
