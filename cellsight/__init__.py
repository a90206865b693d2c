"""Cellsight cellsight."""
