"""Services: the validation engine and its pipeline, the database manager (the spec's face of
:mod:`debug_framework.storage`), batch execution, session diff, the tensor comparison engine."""
