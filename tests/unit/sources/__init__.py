"""unit.sources tests."""
