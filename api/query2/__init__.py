"""Query v2 (Ganeti's query2 design): the field registry, S-expression filters, the
in-memory evaluator, data rows with per-value statuses, and the instance and node
queries behind ``cellsight.api.routes.query``."""
