"""The second toy world, ``mixed``: questions a tiny base answers in text (short sums, memorised products) mixed with
questions it cannot (3-digit products, multi-step expressions), a corpus whose text answers are sometimes wrong and
whose code is sometimes buggy, so that whether, when and how well code pays is something RL has to find out.

Selected by name: ``toy_base: {world: mixed}`` (``zerotir.toy.worlds``); the first world (``products``) stays the
default. See docs/toy_mixed.md.
"""
