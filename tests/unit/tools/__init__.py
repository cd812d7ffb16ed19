"""unit.tools tests."""
