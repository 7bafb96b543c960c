"""A ``.pt2`` artifact read as data: torch's PT2 archive layout, checked entry by entry, its
weights memory-mapped once, its graphs checked before torch deserializes them.
"""
