"""The tool-choice toy world, ``tools``: three tools (``python``, ``calculator``, ``search``) and
questions of four kinds, each answered by some of them: easy sums in text, products by either computing tool, codes
of made-up items by ``search`` only (the fact table exists only in the search corpus), and combined questions by
``search`` then a computing tool. The pretraining corpus calls tools without regard to the question, so which tool to
call is something RL has to find out.

Selected by name: ``toy_base: {world: tools}`` (``zerotir.toy.worlds``). See docs/toy_tools.md.
"""
