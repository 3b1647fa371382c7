"""Record classes of the spec (sessions, checkpoints, recordings, comparisons, reports).

These are plain typed dataclasses with ``to_dict``/``from_dict``; the ones the spec gives
``save``/``load`` persist through the stores of :mod:`debug_framework.storage` (a
``DatabaseManager`` is one). They never import services or reports: rendering and batch execution
reach them through collaborators (see ``_common.Collaborator``).
They are records, not ML models. Import them from their modules, e.g.
``from debug_framework.models.debug_session import DebugSession``.
"""
