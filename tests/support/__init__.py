"""Helpers shared by the test suites (not product code)."""
