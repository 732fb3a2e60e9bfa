"""Fault and soak tests: crash-and-mutate trials against the stores, judged on what was observed."""
