"""orrery tests (a package, so Ray workers can import functions defined in test modules)."""
