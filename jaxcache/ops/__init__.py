"""Collective operations: one module per collective, validation kept apart from lowering."""
