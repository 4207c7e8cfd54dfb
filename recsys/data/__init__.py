"""Canonical schema, the Jagged type, prepared-directory reader and training batches."""
