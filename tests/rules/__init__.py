"""Tests of the zero-search expert rules (schedlib.rules)."""
