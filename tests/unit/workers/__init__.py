"""unit.workers tests."""
