"""Record classes of the spec (sessions, checkpoints, recordings, comparisons, reports).

These are plain typed dataclasses with ``to_dict``/``from_dict``; the ones the spec gives
``save``/``load`` persist through a :class:`~debug_framework.services.database_manager.DatabaseManager`.
They are records, not ML models. Import them from their modules, e.g.
``from debug_framework.models.debug_session import DebugSession``.
"""
