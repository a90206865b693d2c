"""``python -m cellsight`` runs the CLI."""

from cellsight.launch import main

main()
