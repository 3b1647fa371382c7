"""Services: validation engine, database manager, tensor store, session diff (spec names)."""
