"""The cell databases and the API database, and the cluster operations that write them.

``schema`` (tables), ``database`` (engines, timeouts, URL checks), ``mappings`` (the
API database: ``CellRegistry``), ``rows`` (row <-> payload), ``reads`` (keyset-paged
streams, counts), ``scheduler``, ``operations`` (notified after commit), ``seed``.
"""
