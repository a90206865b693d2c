"""``python -m cellsight`` runs the CLI."""

from cellsight.cli import main

main()
