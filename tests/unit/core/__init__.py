"""unit.core tests."""
