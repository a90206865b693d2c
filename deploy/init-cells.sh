#!/bin/sh
# One-shot: register the two cell databases (idempotent: a registered name is kept).
set -eu
for cell in cell1 cell2; do
    case "$cell" in
        cell1) url="$CELL1_DB_URL" ;;
        cell2) url="$CELL2_DB_URL" ;;
    esac
    if cellsight cells list | grep -qw "$cell"; then
        echo "cell $cell already registered"
    else
        cellsight cells add --name "$cell" --db-url "$url"
    fi
done
