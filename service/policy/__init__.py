"""What we decide: pure functions of (facts, settings) -> decisions, each with its reason and source."""
