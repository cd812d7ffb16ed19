"""unit.operators tests."""
