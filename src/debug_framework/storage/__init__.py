"""Storage: the layer below the records. It speaks rows and dicts, never imports models, services or reports.

* :mod:`.core` - :class:`SqlCore`: connections per (process, thread), transactions with busy
  retry, driver errors wrapped into DatabaseError (DF003) / ResourceExhaustedError (DF007).
* :mod:`.dialect` - the narrow seam to the SQL engine (SQLite; :mod:`.postgres` for a server).
* :mod:`.schema` - DDL, enumerations, versioned migrations.
* one store per kind of data: :mod:`.sessions`, :mod:`.checkpoints`, :mod:`.recordings`
  (tensor recordings and comparisons), :mod:`.batches` (the batch queue).
* :mod:`.database` - :class:`Database`: a file with its schema and its stores; :func:`open_database`.
* :mod:`.tensor_store` - the content-addressed tensor files.

Import from the modules (``from debug_framework.storage.database import Database``); this package
file imports nothing so that importing one store stays cheap.
"""
