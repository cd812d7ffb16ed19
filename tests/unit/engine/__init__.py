"""unit.engine tests."""
