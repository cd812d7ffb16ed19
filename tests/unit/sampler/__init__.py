"""unit.sampler tests."""
