"""One filter language for every path: a validated tree, compiled to the engines' query
DSL and to SQL (the embedded index and the cell databases)."""
