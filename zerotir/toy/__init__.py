"""The CPU toy world: a byte-level tokenizer, a tiny base model pretrained on a synthetic corpus, arithmetic tasks.

Importing the package registers the ``toy`` prompt template (``zerotir.toy.template``) with ``zerotir.data.prompts``.
"""

from zerotir.toy import template as _template  # noqa: F401  (registers the "toy" prompt template)
