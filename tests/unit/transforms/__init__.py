"""unit.transforms tests."""
