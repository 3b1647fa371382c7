"""Record classes of the spec (sessions, checkpoints, recordings, comparisons, reports).

These are plain typed dataclasses with ``to_dict``/``from_dict``; the project persists them through
the stores of :mod:`debug_framework.storage` (``db.sessions``, ``db.checkpoints`` ...). The verbs
the spec gives them (``DebugSession.save``, ``ValidationReport.save_to_file``,
``BatchValidationJob.execute`` ...) are faces inherited from :mod:`debug_framework.compat`. They
never import services or reports. They are records, not ML models. Import them from their modules,
e.g. ``from debug_framework.models.debug_session import DebugSession``.
"""
