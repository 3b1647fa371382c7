"""The ``mlx`` engine (and ``metal``, MLX pinned to the Metal GPU): the reference's own models run
over ``mlx.core`` arrays.

Its runner (:mod:`.runner`, ``MLXBackend`` and ``MLXMetalBackend``) and its array namespace
(:mod:`.xp`, registered with :func:`debug_framework.architectures.xp.register_namespace`). It
registers in :data:`debug_framework.backends.registry.BUILTIN_ENGINES`. Nothing is imported here:
the registry imports the modules on first use.
"""
