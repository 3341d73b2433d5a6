"""Data generation: inputs -> retrieve -> label -> assemble -> trajectory records."""
