"""Cellsight api."""
