"""Client-library tests: the single-key writer's pure logic, and the writer against real store pods."""
