"""Upper bounds of the CLI's counts and sizes: a value past one is a usage error naming
the option, where an unbounded one (a typo of many digits) ran a seed or a boot for ever,
or failed deep inside as an integer the database cannot hold."""

MAX_CELLS = 1_000  # new cells a seed makes
MAX_INSTANCES = 100_000_000  # instances a seed puts in each cell
MAX_CHUNK = 1_000_000  # rows a seed inserts, or a sync reads, at once
MAX_WORKERS = 64  # processes or cells at once
MAX_BOOT_COUNT = 1_000  # instances one boot makes
# A node's capacities: what the compute_nodes columns hold (Integer, 32 bits on
# PostgreSQL and MariaDB, as in Nova's schema).
INT_MAX = 2**31 - 1
# Seconds an option waits between passes (``outbox relay --every``, ``demo --interval``):
# the settings' own maximum (``cellsight.settings.MAX_SECONDS``, a week). Past ~9.2e9 s,
# or inf, a thread's wait overflowed and the thread died while the command hung.
MAX_SECONDS = 7 * 24 * 3600
MAX_LETTERS = 10_000_000  # dead letters one ``dlq list`` or ``dlq replay`` handles
MAX_KEEP_OLD = 1_000  # previous indexes a sync keeps
