"""Cellsight indexer."""
