"""Cellsight cells."""
