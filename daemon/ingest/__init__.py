"""Ingest: failure callbacks in, checked (signature, shape, size) and handed to the store."""
