"""unit.state tests."""
